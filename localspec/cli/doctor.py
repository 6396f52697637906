"""``localspec doctor``: what localspec runs on, whether that build is safe here, and what is cached."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path
from typing import Annotated, Optional

import typer

from localspec import __version__, paths
from localspec.cli.console import err, format_size, out
from localspec.engine.llama import kernels, machine, rpc
from localspec.engine.llama.rpc import parse_layout
from localspec.errors import GGUFError
from localspec.gguf.header import read_header
from localspec.gguf.heads import model_heads
from localspec.gguf.memory import architecture, speculation_note
from localspec.store import cache as store


def doctor_command(
    rpc: Annotated[Optional[str], typer.Option("--rpc", help="Also check these RPC servers: HOST:PORT[,HOST:PORT].")] = None,
) -> None:
    """Report versions, GPU offload, CPU features, AMX risk, the model cache and free disk; exit 1 if unusable."""
    out.prose(f"localspec {__version__} on Python {platform.python_version()} ({platform.system()} {platform.machine()})")
    cpu_flags = machine.cpu_features()
    out.prose(f"CPU features: {' '.join(cpu_flags) or 'unknown'}")
    usable = _report_llama(cpu_flags)
    if usable and rpc is not None:
        _report_rpc(parse_layout(rpc).servers)
    _report_cache()
    if not usable:
        raise typer.Exit(1)


def _report_llama(cpu_flags: list[str]) -> bool:
    try:
        build = machine.build_info()
    except Exception as exc:  # a broken native build fails with OSError, ImportError, ...
        err.prose(f"[bold red]llama-cpp-python cannot be imported:[/] {exc}; run scripts/setup", markup=True)
        return False
    out.prose(f"llama-cpp-python {build.version} ({build.module})")
    out.prose(f"llama.cpp build: {build.system_info}")
    out.prose(f"GPU offload: {build.gpu_offload or 'none (CPU only)'}")
    if "LLAMAFILE = 1" in build.system_info:
        # Verification batches then sum in another order than one-token steps (engine/llama/kernels.py).
        err.prose(
            "[bold yellow]warning: this build uses llamafile's sgemm, so greedy speculative output can differ "
            "from target-alone output in near-tie tokens; run scripts/setup to rebuild with GGML_LLAMAFILE=OFF[/]",
            markup=True,
        )
    if build.gpu_offload:
        # Layers are offloaded by default, and the GPU kernels are not batch-invariant: say which applies where.
        out.prose(f"verification kernels with layers on the GPU (the default): {kernels.kernels_description(kernels.FAST)}")
        out.prose(f"verification kernels on the CPU (--gpu-layers 0, or --exact): {kernels.kernels_description(build.kernels)}")
    else:
        out.prose(f"verification kernels: {kernels.kernels_description(build.kernels)}")
    if build.kernels != kernels.EXACT:
        err.prose(
            "[bold yellow]note: this llama.cpp build lacks localspec's exact-kernel patch: greedy output is lossless "
            "up to floating-point rounding (--exact forces bit-identity, slower); run scripts/setup[/]",
            markup=True,
        )
    if not build.amx_backend:
        return True
    crashes_here = any(flag.startswith("amx") for flag in cpu_flags)
    err.prose(
        "[bold red]WARNING: this llama.cpp build carries the AMX backend"
        + (", and this CPU has AMX: it segfaults on the first decode (llama.cpp #20824)." if crashes_here else ".")
        + " Rebuild without it: delete .venv/.localspec-setup and run scripts/setup.[/]",
        markup=True,
    )
    return not crashes_here


def _report_rpc(servers: tuple[str, ...]) -> None:
    """The build servers must run, then each server's devices and memory (a refused server: its reason)."""
    out.prose(f"RPC build: {rpc.local_build()}")
    for server in servers:
        try:
            rpc.check_servers([server])
            for line in rpc.device_descriptions([server]):
                out.prose(f"  {line}")
        except rpc.RpcServerError as exc:
            err.prose(f"  [bold red]{exc}[/]", markup=True)


def _report_cache() -> None:
    models = paths.models_dir()
    files = store.cached_files()
    out.prose(f"model cache: {models} ({len(files)} files, {format_size(sum(s for _, s in files)) if files else 'empty'})")
    for path, size in files:
        out.prose(f"  {path.relative_to(models)}  {format_size(size)}  {_memory_line(path)}")
    existing = next(p for p in (models, *models.parents) if p.exists())
    out.prose(f"free disk: {format_size(shutil.disk_usage(existing).free)} at {existing}")


def _memory_line(path: Path) -> str:
    """How speculation rolls this model's memory back, and its drafting heads (from its header; nothing is
    loaded)."""
    try:
        header = read_header(path, check_tensors=False)
        return f"{speculation_note(architecture(header))}; {model_heads(header).describe()}"
    except (GGUFError, OSError) as exc:
        return f"(header unreadable: {exc})"
