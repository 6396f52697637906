"""Options shared by ``run``, ``chat`` and ``bench``, and how they combine with a profile's defaults.

An option given on the command line wins; otherwise the profile's default; otherwise the built-in one.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from localspec.cli.pull import rich_progress
from localspec.engine.controller import METHODS
from localspec.engine.decoder import SpeculativeDecoder
from localspec.engine.sampling import SamplingParams
from localspec.errors import UsageError
from localspec.profiles import DEFAULT_PROFILE, Defaults
from localspec.session import ModelOptions, Pair, ensure_compatible, open_decoder, resolve_pair

ProfileOpt = Annotated[
    Optional[str], typer.Option("--profile", "-p", help=f"Model pair to use [default: {DEFAULT_PROFILE}].")
]
TargetOpt = Annotated[Optional[Path], typer.Option("--target", help="Target GGUF file (instead of a profile).")]
DraftOpt = Annotated[Optional[Path], typer.Option("--draft", help="Draft GGUF file (same tokenizer as the target).")]
MethodOpt = Annotated[
    Optional[str], typer.Option("--method", help="none, draft, lookup, hybrid or auto [default: profile's, else auto].")
]
DraftLenOpt = Annotated[
    Optional[int], typer.Option("--draft-len", min=1, help="Fixed draft length [default: chosen from measured costs].")
]
TempOpt = Annotated[Optional[float], typer.Option("--temp", min=0.0, help="Temperature; 0 is greedy [default: profile's].")]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", min=0, help="Top-k filter, 0 to disable.")]
TopPOpt = Annotated[Optional[float], typer.Option("--top-p", min=0.0, max=1.0, help="Top-p filter, 1 to disable.")]
MinPOpt = Annotated[Optional[float], typer.Option("--min-p", min=0.0, max=1.0, help="Min-p filter, 0 to disable.")]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="Random seed for sampling.")]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", "-n", min=1, help="Most tokens to generate.")]
CtxOpt = Annotated[Optional[int], typer.Option("--ctx", min=64, help="Context window in tokens [default: profile's].")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads [default: all cores up to 4].")]
GpuLayersOpt = Annotated[Optional[int], typer.Option("--gpu-layers", help="Target layers to offload (-1 all, 0 none).")]
DraftGpuLayersOpt = Annotated[Optional[int], typer.Option("--draft-gpu-layers", help="Draft layers to offload.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Run even if the checker finds the pair incompatible.")]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Use only models already in the cache.")]


def _pick(given, default):
    return default if given is None else given


@dataclass
class GenerationOptions:
    """Everything a generating command was given, before profile defaults are applied."""

    profile: str | None = None
    target: Path | None = None
    draft: Path | None = None
    method: str | None = None
    draft_len: int | None = None
    temp: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    ctx: int | None = None
    threads: int | None = None
    gpu_layers: int | None = None
    draft_gpu_layers: int | None = None
    force: bool = False
    offline: bool = False

    def open(self) -> tuple[Pair, SpeculativeDecoder, SamplingParams]:
        """Resolve the pair (downloading a profile's models if needed), check it, load the target."""
        if self.method is not None and self.method not in METHODS:
            raise UsageError(f"unknown --method {self.method!r}; use one of {', '.join(METHODS)}")
        with rich_progress() as progress:
            pair = resolve_pair(
                profile=self.profile, target=self.target, draft=self.draft, offline=self.offline, progress=progress
            )
        defaults = pair.profile.defaults if pair.profile else Defaults()
        ensure_compatible(pair, force=self.force)
        options = ModelOptions(
            n_ctx=_pick(self.ctx, defaults.n_ctx),
            threads=_pick(self.threads, defaults.threads),
            gpu_layers=_pick(self.gpu_layers, defaults.gpu_layers),
            draft_gpu_layers=_pick(self.draft_gpu_layers, defaults.draft_gpu_layers),
        )
        method = _pick(self.method, defaults.method)
        draft_len = _pick(self.draft_len, defaults.draft_len)
        decoder = open_decoder(pair, options, method=method, draft_len=draft_len)
        sampling = SamplingParams(
            temperature=_pick(self.temp, defaults.temperature),
            top_k=_pick(self.top_k, defaults.top_k),
            top_p=_pick(self.top_p, defaults.top_p),
            min_p=_pick(self.min_p, defaults.min_p),
            seed=self.seed,
        )
        return pair, decoder, sampling
