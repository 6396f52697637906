"""Loading llama-cpp-python: its log routed through LOCALSPEC_DEBUG, and where its shared libraries are.

Only the public module is imported here; model.py and heads.py, beside it in the llama.cpp door, reach into
its internals.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import sys
from pathlib import Path

from localspec.errors import debug_enabled

_log_callback = None  # kept referenced: llama.cpp holds a raw pointer to it


def load_llama_cpp():
    """The ``llama_cpp`` module, with llama.cpp's log sent to stderr only when LOCALSPEC_DEBUG is set.

    llama-cpp-python's own callback maps ggml's log levels with an outdated table, so warnings such as
    "n_ctx_seq > n_ctx_train" would reach the terminal even with verbose=False.
    """
    global _log_callback
    import llama_cpp

    if _log_callback is None:

        @llama_cpp.llama_log_callback
        def callback(level, text, user_data):
            if debug_enabled():
                sys.stderr.write(text.decode("utf-8", "replace"))

        _log_callback = callback
        llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    return llama_cpp


def load_native_libraries_first() -> None:
    """Before anything imports numpy: the C++ runtime into the global namespace, and a GPU build of llama.cpp.

    On a lent H200's Python (torch's image: numpy 2.5.2 with scipy-openblas, CUDA 13) a process that had
    imported numpy before its first model load segfaulted there, in the tokenizer's set-up (the cause is
    not established). A CUDA build ran once llama-cpp-python was imported first; a CPU build still crashed
    then, and ran with the C++ runtime preloaded (LD_PRELOAD), which loading it globally here stands for.
    """
    if sys.platform.startswith("linux") and "numpy" not in sys.modules:
        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:  # no GNU C++ runtime here: llama.cpp's libraries bring what they link
            pass
    directory = _installed_lib_dir()
    if directory is not None and "numpy" not in sys.modules and any(directory.glob("libggml-cuda*")):
        try:
            load_llama_cpp()
        except Exception:  # a broken build: the command that needs it says so (doctor: "cannot be imported")
            return


def _installed_lib_dir() -> Path | None:
    """Where llama-cpp-python loads llama.cpp's shared libraries from (it honours LLAMA_CPP_LIB_PATH too),
    found without importing it; None when it is not installed."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(next(iter(spec.submodule_search_locations))) / "lib")


def lib_dir() -> Path:
    """Where llama-cpp-python loads llama.cpp's shared libraries from, once it has loaded them."""
    load_llama_cpp()
    directory = _installed_lib_dir()
    assert directory is not None  # the package was just imported
    return directory


def library_file(directory: Path, name: str) -> Path | None:
    """A shared library of llama.cpp's by its name without prefix and suffix ("ggml-cpu"), on any platform."""
    return next((directory / f for f in (f"lib{name}.so", f"lib{name}.dylib", f"{name}.dll") if (directory / f).exists()),
                None)


def loaded_cpu_library() -> Path | None:
    """The file llama.cpp's CPU backend runs from. A wheel holds libggml-cpu.so, .so.0 and .so.0.x as separate
    copies on Linux, and another copy than the one llama.cpp loaded would have globals of its own."""
    directory = lib_dir()  # imports llama_cpp, which loads the backend
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and Path(fields[5]).name.startswith("libggml-cpu."):
                return Path(fields[5])
    return library_file(directory, "ggml-cpu")


# ggml-backend.h: enum ggml_backend_dev_type, GGML_BACKEND_DEVICE_TYPE_GPU and _IGPU
_GGML_DEVICE_GPUS = (1, 2)


@functools.cache
def gpu_devices() -> tuple[str, ...]:
    """The GPUs llama.cpp's backends see, as "CUDA0: NVIDIA H100 80GB HBM3, 79.1 of 79.2 GiB free"; empty
    for a CPU-only build (or one whose ggml does not export the device registry). RPC servers are not in the
    registry (localspec hands their devices to the model itself), so they never count as a GPU here, unlike in
    llama_supports_gpu_offload(), which says yes to any build with the RPC backend."""
    directory = lib_dir()  # imports llama_cpp, which registers the backends
    path = library_file(directory, "ggml")
    if path is None:
        return ()
    ggml = ctypes.CDLL(str(path))
    if not hasattr(ggml, "ggml_backend_dev_count"):
        return ()
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.argtypes, ggml.ggml_backend_dev_get.restype = [ctypes.c_size_t], ctypes.c_void_p
    ggml.ggml_backend_dev_type.argtypes, ggml.ggml_backend_dev_type.restype = [ctypes.c_void_p], ctypes.c_int
    for name in ("ggml_backend_dev_name", "ggml_backend_dev_description"):
        getattr(ggml, name).argtypes, getattr(ggml, name).restype = [ctypes.c_void_p], ctypes.c_char_p
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
                                             ctypes.POINTER(ctypes.c_size_t)]
    ggml.ggml_backend_dev_memory.restype = None
    devices = []
    for i in range(ggml.ggml_backend_dev_count()):
        device = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(device) not in _GGML_DEVICE_GPUS:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        name = ggml.ggml_backend_dev_name(device).decode(errors="replace")
        description = ggml.ggml_backend_dev_description(device).decode(errors="replace")
        devices.append(f"{name}: {description}, {free.value / 2**30:.1f} of {total.value / 2**30:.1f} GiB free")
    return tuple(devices)
