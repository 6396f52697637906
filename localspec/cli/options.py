"""Options shared by every generating command (``run``, ``chat``, ``bench``, ``serve``), defined once.

``@generation_options()`` adds them to a command and hands it one ``GenerationOptions``, built by keyword.
``GenerationOptions.open`` applies a profile's defaults: an option given on the command line wins;
otherwise the profile's default; otherwise the built-in one.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Annotated, Optional

import typer

from localspec.cli.console import rich_progress
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.drafters.draft_model import NO_DRAFT_MODEL, DraftModelDrafter
from localspec.engine.drafters.registry import METHODS, check_method
from localspec.engine.llama.memory import DEFAULT_ROLLBACK_SNAPSHOTS
from localspec.engine.llama.rpc import RpcLayout, parse_layout
from localspec.errors import UsageError
from localspec.profiles import DEFAULT_PROFILE, Defaults
from localspec.session import ModelOptions, Pair, ensure_compatible, open_decoder, resolve_pair

ProfileOpt = Annotated[
    Optional[str], typer.Option("--profile", "-p", help=f"Model pair to use [default: {DEFAULT_PROFILE}].")
]
TargetOpt = Annotated[Optional[Path], typer.Option("--target", help="Target GGUF file (instead of a profile).")]
DraftOpt = Annotated[Optional[Path], typer.Option("--draft", help="Draft GGUF file (same tokenizer as the target).")]
MethodOpt = Annotated[
    Optional[str], typer.Option("--method", help=f"{', '.join(METHODS[:-1])} or {METHODS[-1]} [default: profile's, else auto].")
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
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", min=1, help="CPU threads [default: all cores up to 4, else half].")]
GpuLayersOpt = Annotated[Optional[int], typer.Option("--gpu-layers", help="Target layers to offload (-1 all, 0 none).")]
DraftGpuLayersOpt = Annotated[Optional[int], typer.Option("--draft-gpu-layers", help="Draft layers to offload.")]
SnapshotsOpt = Annotated[
    Optional[int],
    typer.Option(
        "--snapshots",
        min=0,
        max=64,
        help="Hybrid and recurrent targets: per-token state snapshots per pass, so verifications of up to N drafts "
        "roll back in place; every pass then writes them (0: checkpoint and replay instead) [default: 0].",
    ),
]
RpcOpt = Annotated[
    Optional[str],
    typer.Option(
        "--rpc",
        help="Spread the target's layers over this machine and llama.cpp RPC servers HOST:PORT[,HOST:PORT] "
        "(started there with 'localspec rpc-server'); drafts stay here [default: profile's, else none].",
    ),
]
TensorSplitOpt = Annotated[
    Optional[str],
    typer.Option(
        "--tensor-split",
        help="With --rpc: the target's layers in these proportions, this machine's first, then each server's "
        "(e.g. 1,2,2) [default: equal].",
    ),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Run even if the checker finds the pair incompatible.")]
OfflineOpt = Annotated[bool, typer.Option("--offline", help="Use only models already in the cache.")]
NoHistoryOpt = Annotated[
    bool,
    typer.Option(
        "--no-history",
        help="Neither draft from earlier answers nor keep this one (suffix decoding; see 'localspec history').",
    ),
]
ExactOpt = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="Bit-identical verification even where it costs speed (a build without localspec's patch, a GPU); "
        "on a patched CPU build it is always on.",
    ),
]


def _pick(given, default):
    return default if given is None else given


@dataclass(frozen=True)
class GenerationOptions:
    """Everything a generating command was given, before profile defaults are applied.

    Each field's annotation is its command-line option, so adding a field here adds the option to every
    command decorated with ``generation_options``.
    """

    profile: ProfileOpt = None
    target: TargetOpt = None
    draft: DraftOpt = None
    method: MethodOpt = None
    draft_len: DraftLenOpt = None
    temp: TempOpt = None
    top_k: TopKOpt = None
    top_p: TopPOpt = None
    min_p: MinPOpt = None
    seed: SeedOpt = None
    ctx: CtxOpt = None
    threads: ThreadsOpt = None
    gpu_layers: GpuLayersOpt = None
    draft_gpu_layers: DraftGpuLayersOpt = None
    snapshots: SnapshotsOpt = None
    rpc: RpcOpt = None
    tensor_split: TensorSplitOpt = None
    force: ForceOpt = False
    offline: OfflineOpt = False
    exact: ExactOpt = False
    no_history: NoHistoryOpt = False

    def open(self) -> tuple[Pair, SpeculativeDecoder, SamplingParams]:
        """Resolve the pair (downloading a profile's models if needed), check it, load the target."""
        if self.method is not None:
            check_method(self.method, given_as="--method")  # a typo fails before any download
        with rich_progress() as progress:
            pair = resolve_pair(
                profile=self.profile, target=self.target, draft=self.draft, offline=self.offline, progress=progress
            )
        defaults = pair.profile.defaults if pair.profile else Defaults()
        ensure_compatible(pair, force=self.force)
        method = _pick(self.method, defaults.method)
        # The heads are known once the target is open; a missing draft model is known now.
        check_method(method, missing={} if pair.draft else {DraftModelDrafter.source: NO_DRAFT_MODEL}, given_as="--method")
        options = ModelOptions(
            rpc=self.rpc_layout(defaults),
            n_ctx=_pick(self.ctx, defaults.n_ctx),
            threads=_pick(self.threads, defaults.threads),
            gpu_layers=_pick(self.gpu_layers, defaults.gpu_layers),
            draft_gpu_layers=_pick(self.draft_gpu_layers, defaults.draft_gpu_layers),
            exact=True if self.exact else None,
            rollback_snapshots=_pick(self.snapshots, DEFAULT_ROLLBACK_SNAPSHOTS),
        )
        draft_len = _pick(self.draft_len, defaults.draft_len)
        history = defaults.history and not self.no_history
        decoder = open_decoder(pair, options, method=method, draft_len=draft_len, history=history)
        sampling = SamplingParams(
            temperature=_pick(self.temp, defaults.temperature),
            top_k=_pick(self.top_k, defaults.top_k),
            top_p=_pick(self.top_p, defaults.top_p),
            min_p=_pick(self.min_p, defaults.min_p),
            seed=self.seed,
        )
        return pair, decoder, sampling


    def rpc_layout(self, defaults: Defaults) -> RpcLayout | None:
        """The RPC layout given (each part from the command line, else the profile), or None for one machine."""
        servers = self.rpc if self.rpc is not None else ",".join(defaults.rpc)
        split = self.tensor_split
        if split is None and defaults.tensor_split is not None:
            split = ",".join(f"{s:g}" for s in defaults.tensor_split)
        if not servers:
            if self.tensor_split is not None:
                raise UsageError("--tensor-split needs --rpc HOST:PORT[,HOST:PORT]")
            return None
        return parse_layout(servers, split)


# Options bench sets per configuration (its --methods and --draft-len take lists).
SPECULATION_OPTIONS = ("method", "draft_len")


def generation_options(*, speculation: bool = True) -> Callable[[Callable], Callable]:
    """Decorator: add the shared options to a Typer command and pass it ``generation=GenerationOptions``.

    The command declares its own parameters plus ``generation``; the shared options follow its own in
    ``--help``. Without ``speculation``, ``--method`` and ``--draft-len`` are left out.
    """
    hints = typing.get_type_hints(GenerationOptions, include_extras=True)
    shared = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name], default=f.default)
        for f in fields(GenerationOptions)
        if speculation or f.name not in SPECULATION_OPTIONS
    ]

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command, eval_str=True)
        own = [p for name, p in signature.parameters.items() if name != "generation"]
        if len(own) == len(signature.parameters):
            raise TypeError(f"{command.__name__} needs a 'generation' parameter")

        @functools.wraps(command)
        def wrapper(**kwargs):
            generation = GenerationOptions(**{p.name: kwargs.pop(p.name) for p in shared})
            return command(generation=generation, **kwargs)

        # Typer reads the parameters from the signature and their types from __annotations__.
        wrapper.__signature__ = signature.replace(parameters=[*own, *shared])
        wrapper.__annotations__ = {p.name: p.annotation for p in (*own, *shared)}
        return wrapper

    return decorate
