"""The machine localspec runs on: CPU model and features, default threads, and the llama.cpp build
(``doctor`` reports these; pass costs are keyed by them)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from localspec.engine.llama.kernels import choose_kernels
from localspec.engine.llama.library import gpu_devices, lib_dir, load_llama_cpp

# CPU features that decide which llama.cpp kernels can run.
CPU_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
)
# The AMX backend's own symbols/buffer-type name; "ggml_cpu_has_amx_int8" alone is only a feature probe.
_AMX_BACKEND = re.compile(rb"ggml_backend_amx|\x00AMX\x00")


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module knows."""
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        match = None
    return match.group(1).strip() if match else platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """The CPU_FLAGS this CPU has (ARM's own on ARM); empty when the system does not say."""
    if sys.platform == "darwin":
        return _sysctl_features()
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    match = re.search(r"^(?:flags|Features)\s*:(.*)$", text, re.M)
    flags = set(match.group(1).split()) if match else set()
    return [f for f in CPU_FLAGS if f in flags] + sorted(f for f in flags if f in ("neon", "asimd", "sve"))


def _sysctl_features() -> list[str]:
    try:
        text = subprocess.run(["sysctl", "-a"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(m.group(1) for m in re.finditer(r"^hw\.optional\.(?:arm\.)?(\w+): 1$", text, re.M))


def default_threads() -> int:
    """All usable cores on small machines; half of them (physical cores, usually) on larger ones."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return n if n <= 4 else n // 2


@dataclass(frozen=True)
class BuildInfo:
    """What the installed llama-cpp-python was compiled with (for ``doctor``)."""

    version: str
    module: str  # where llama_cpp was imported from
    system_info: str  # llama.cpp's own "CPU : AVX2 = 1 | ..." line
    gpu_offload: str | None  # the GPU backends compiled in; None for a CPU-only build
    kernels: str  # the default kernel mode on the CPU: EXACT with scripts/patches/llama-cpp-exact.patch
    amx_backend: bool  # carries the AMX backend, which crashes on AMX CPUs (llama.cpp #20824)


def build_info() -> BuildInfo:
    """Inspect the installed build; raises whatever a broken native build raises on import."""
    llama_cpp = load_llama_cpp()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    directory = lib_dir()
    return BuildInfo(
        version=llama_cpp_version(),
        module=llama_cpp.__file__,
        system_info=system_info,
        gpu_offload=gpu_backends(directory, system_info) if gpu_devices() else None,
        kernels=choose_kernels(exact=None, gpu_layers=0),
        amx_backend=has_amx_backend(directory, system_info),
    )


def llama_cpp_version() -> str:
    return importlib.metadata.version("llama-cpp-python")


def has_amx_backend(lib_dir: Path, system_info: str) -> bool:
    """True when the build compiled AMX kernels: reported in system info or present in the shared libraries."""
    if re.search(r"AMX\w* = 1", system_info):
        return True
    return any(_AMX_BACKEND.search(lib.read_bytes()) for lib in sorted(lib_dir.glob("*.so*")) + sorted(lib_dir.glob("*.dylib")))


def gpu_backends(lib_dir: Path, system_info: str) -> str:
    """The GPU backends compiled in, and the devices they see ("no GPU found" when a build has none to use)."""
    names = [name for name in ("CUDA", "Metal", "Vulkan", "HIP", "SYCL") if name.lower() in system_info.lower()]
    names += [lib.name for lib in lib_dir.glob("libggml-*") if any(n in lib.name for n in ("cuda", "metal", "vulkan", "hip"))]
    backends = ", ".join(dict.fromkeys(names)) or "compiled in"
    return f"{backends}; {'; '.join(gpu_devices()) or 'no GPU found'}"
