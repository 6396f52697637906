"""``localspec doctor``: what localspec runs on, whether that build is safe here, and what is cached."""

from __future__ import annotations

import importlib.metadata
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import typer

from localspec import __version__, paths, store
from localspec.cli.console import err, format_size, out

# CPU features that decide which llama.cpp kernels can run.
CPU_FLAGS = (
    "avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
)
# The AMX backend's own symbols/buffer-type name; "ggml_cpu_has_amx_int8" alone is only a feature probe.
_AMX_BACKEND = re.compile(rb"ggml_backend_amx|\x00AMX\x00")


def doctor_command() -> None:
    """Report versions, GPU offload, CPU features, AMX risk, the model cache and free disk; exit 1 if unusable."""
    out.print(f"localspec {__version__} on Python {platform.python_version()} ({platform.system()} {platform.machine()})")
    cpu_flags = cpu_features()
    out.print(f"CPU features: {' '.join(cpu_flags) or 'unknown'}")
    usable = _report_llama(cpu_flags)
    _report_cache()
    if not usable:
        raise typer.Exit(1)


def _report_llama(cpu_flags: list[str]) -> bool:
    try:
        import llama_cpp
    except Exception as exc:  # a broken native build fails with OSError, ImportError, ...
        err.print(f"[bold red]llama-cpp-python cannot be imported:[/] {exc}; run scripts/setup")
        return False
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    lib_dir = Path(llama_cpp.__file__).parent / "lib"
    out.print(f"llama-cpp-python {importlib.metadata.version('llama-cpp-python')} ({llama_cpp.__file__})")
    out.print(f"llama.cpp build: {system_info}")
    offload = gpu_backends(lib_dir, system_info) if llama_cpp.llama_supports_gpu_offload() else "none (CPU only)"
    out.print(f"GPU offload: {offload}")
    if "LLAMAFILE = 1" in system_info:
        # Verification batches then sum in another order than one-token steps (engine/backend.py).
        err.print(
            "[bold yellow]warning: this build uses llamafile's sgemm, so greedy speculative output can differ "
            "from target-alone output in near-tie tokens; run scripts/setup to rebuild with GGML_LLAMAFILE=OFF[/]"
        )
    patched = has_exact_tiled(lib_dir)
    if patched and "AVX512_VNNI = 1" in system_info:
        out.print("batched verification: fast tiled kernels, bit-identical to one-token steps (patched build)")
    elif patched:
        # The patch's small-batch kernel mirrors the AVX-512 VNNI microkernel; elsewhere exact mode is vec_dot.
        out.print("batched verification: vec_dot kernels, bit-identical but slower (no exact tiled kernel for this CPU)")
    else:
        err.print(
            "[bold yellow]note: this llama.cpp build lacks localspec's exact tiled-matmul patch: output stays "
            "lossless but verification batches and prompts run about 2x slower; run scripts/setup[/]"
        )
    if not has_amx_backend(lib_dir, system_info):
        return True
    crashes_here = any(flag.startswith("amx") for flag in cpu_flags)
    err.print(
        "[bold red]WARNING: this llama.cpp build carries the AMX backend"
        + (", and this CPU has AMX: it segfaults on the first decode (llama.cpp #20824)." if crashes_here else ".")
        + " Rebuild without it: delete .venv/.localspec-setup and run scripts/setup.[/]"
    )
    return not crashes_here


def _report_cache() -> None:
    models = paths.models_dir()
    files = store.cached_files()
    out.print(f"model cache: {models} ({len(files)} files, {format_size(sum(s for _, s in files)) if files else 'empty'})")
    for path, size in files:
        out.print(f"  {path.relative_to(models)}  {format_size(size)}")
    existing = next(p for p in (models, *models.parents) if p.exists())
    out.print(f"free disk: {format_size(shutil.disk_usage(existing).free)} at {existing}")


def has_amx_backend(lib_dir: Path, system_info: str) -> bool:
    """True when the build compiled AMX kernels: reported in system info or present in the shared libraries."""
    if re.search(r"AMX\w* = 1", system_info):
        return True
    return any(_AMX_BACKEND.search(lib.read_bytes()) for lib in sorted(lib_dir.glob("*.so*")) + sorted(lib_dir.glob("*.dylib")))


def has_exact_tiled(lib_dir: Path) -> bool:
    """True when the CPU backend understands GGML_CPU_TILED_MM=exact (scripts/patches/llama-cpp-exact-tiled.patch)."""
    return any(b"\0exact\0" in lib.read_bytes() for lib in lib_dir.glob("libggml-cpu*"))


def gpu_backends(lib_dir: Path, system_info: str) -> str:
    names = [name for name in ("CUDA", "Metal", "Vulkan", "HIP", "SYCL") if name.lower() in system_info.lower()]
    names += [lib.name for lib in lib_dir.glob("libggml-*") if any(n in lib.name for n in ("cuda", "metal", "vulkan", "hip"))]
    return ", ".join(dict.fromkeys(names)) or "compiled in"


def cpu_features() -> list[str]:
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
