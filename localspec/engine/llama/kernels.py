"""Exact or fast kernels: which ones verify, the switches that select them, and the patched build's probe.

See the README, "Exact or fast kernels". ggml reads its kernel switch (GGML_CPU_TILED_MM) once per
process, at the first matmul, so the choice is process-wide; the patched build adds a second switch, set
around a prompt's prefill, that lets a prefill take the faster paths at any batch size.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Iterator

from localspec.engine.llama.library import gpu_devices, loaded_cpu_library
from localspec.errors import LocalspecError

EXACT = "exact"  # bit-identical: greedy output equals the target's, token for token
FAST = "fast"  # stock kernels: lossless up to floating-point rounding, measured not promised
# Exact kernels keep batches up to this size invariant; larger ones (prompt prefill) take faster kernels.
# A patched build that exports its own cap (ggml_exact_verify_max) must agree, or exact mode is refused.
MAX_VERIFY_BATCH = 128
_EXACT_SYMBOL = "ggml_tiled_exact_mode"  # exported by scripts/patches/llama-cpp-exact.patch
_CAP_SYMBOL = "ggml_exact_verify_max"  # exported by later versions of the patch
_kernels_in_process: str | None = None


@functools.cache
def _patched_cpu_lib() -> ctypes.CDLL | None:
    """llama.cpp's CPU backend library when it carries localspec's patch, else None."""
    path = loaded_cpu_library()
    if path is None:
        return None
    lib = ctypes.CDLL(str(path))
    if not hasattr(lib, _EXACT_SYMBOL):
        return None
    lib.ggml_exact_set_prefill.argtypes = [ctypes.c_bool]
    lib.ggml_exact_set_prefill.restype = None
    return lib


def exact_kernels_built() -> bool:
    """True when llama.cpp was built with localspec's batch-invariant kernels (scripts/setup does that)."""
    return _patched_cpu_lib() is not None


def build_verify_cap() -> int | None:
    """The largest batch the patched build keeps batch-invariant, where it says (older patches do not)."""
    lib = _patched_cpu_lib()
    if lib is None or not hasattr(lib, _CAP_SYMBOL):
        return None
    getter = getattr(lib, _CAP_SYMBOL)
    getter.argtypes, getter.restype = [], ctypes.c_int
    return int(getter())


def _check_verify_cap() -> None:
    cap = build_verify_cap()
    if cap is not None and cap != MAX_VERIFY_BATCH:
        raise LocalspecError(
            f"this llama.cpp build keeps verification exact up to {cap} tokens but localspec drafts up to "
            f"{MAX_VERIFY_BATCH}; rebuild it with scripts/setup"
        )


def choose_kernels(*, exact: bool | None, gpu_layers: int) -> str:
    """EXACT where it costs nothing (a patched build on the CPU), FAST elsewhere unless ``exact`` forces it.

    GPU backends are not checked for batch invariance, so a forced exact run keeps the target on the CPU.
    """
    if exact is not None:
        return EXACT if exact else FAST
    on_gpu = gpu_layers != 0 and bool(gpu_devices())
    return EXACT if exact_kernels_built() and not on_gpu else FAST


def kernels_description(kernels: str) -> str:
    """One line for doctor and the live view: which kernels verify, and what that promises."""
    if kernels == FAST:
        return "fast: stock llama.cpp kernels, lossless up to floating-point rounding (exact ones are bit-identical)"
    if exact_kernels_built():
        return "exact: batch-invariant kernels at stock speed, verified tokens bit-identical to one-token decoding"
    return "exact: stock kernels' one-row paths only (this build lacks localspec's patch), bit-identical but slower"


def use_kernels(kernels: str) -> None:
    """Set ggml's process-wide kernel switch for ``kernels``, once per process."""
    global _kernels_in_process
    if _kernels_in_process not in (None, kernels):
        raise LocalspecError(
            f"this process already runs llama.cpp with {_kernels_in_process} kernels and cannot switch to "
            f"{kernels}; start a new process for the other mode"
        )
    if kernels == EXACT:
        _check_verify_cap()
        # A patched build: its batch-invariant kernels. An unpatched one reads "exact" as 0: vec_dot only.
        os.environ["GGML_CPU_TILED_MM"] = "exact"
    else:
        os.environ.pop("GGML_CPU_TILED_MM", None)
    os.environ.pop("GGML_CPU_TILED_MM_FORCE", None)
    _kernels_in_process = kernels


@contextlib.contextmanager
def prefill_paths(kernels: str) -> Iterator[None]:
    """Within it, exact kernels take their faster prefill paths at any batch size (a prompt is prefilled
    the same way on every decoding path); a no-op for fast kernels and unpatched builds."""
    lib = _patched_cpu_lib() if kernels == EXACT else None
    if lib is None:
        yield
        return
    lib.ggml_exact_set_prefill(True)
    try:
        yield
    finally:
        lib.ggml_exact_set_prefill(False)
