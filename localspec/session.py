"""Opening a target/draft pair: find the files, check they can be paired, build the decoder.

``run``, ``chat`` and ``bench`` all open models through here, so they load, check and configure alike;
``check`` and ``pull`` compare pairs given as local files, ``hf://`` references or profiles through here too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from localspec import paths
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.drafters.mtp import MtpDrafter
from localspec.engine.drafters.registry import uses
from localspec.engine.llama.kernels import EXACT
from localspec.engine.llama.memory import DEFAULT_ROLLBACK_SNAPSHOTS
from localspec.engine.llama.model import DEFAULT_N_CTX, Model
from localspec.engine.llama.rpc import RpcLayout
from localspec.engine.llama.vocab import VocabOnlyTokenizer
from localspec.engine.persist.history import HistoryStore, tokenizer_identity
from localspec.engine.persist.pass_costs import PassCostMemory
from localspec.engine.planner.costs import DEFAULT_DRAFT_COST_RATIO
from localspec.errors import IncompatibleError, UsageError
from localspec.gguf.compat import Report, check_model, check_pair
from localspec.gguf.header import MAX_HEADER_BYTES, GGUFTruncatedError, read_header, read_header_prefix
from localspec.gguf.heads import companion_head
from localspec.profiles import DEFAULT_PROFILE, ModelSpec, Profile, load_profile
from localspec.store import cache as store

# A first fetch big enough for most headers; a 262k-token vocabulary needs a second, larger one.
FIRST_PREFIX_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ModelOptions:
    n_ctx: int = DEFAULT_N_CTX
    threads: int | None = None
    gpu_layers: int = -1
    draft_gpu_layers: int = -1
    exact: bool | None = None  # bit-exact verification: None where it costs nothing, True forces it
    rollback_snapshots: int = DEFAULT_ROLLBACK_SNAPSHOTS  # a hybrid target's per-pass state snapshots
    rpc: RpcLayout | None = None  # the target's layers over this machine and llama.cpp RPC servers


@dataclass(frozen=True)
class Pair:
    target: Path
    draft: Path | None
    label: str  # the profile name, or the target file name
    profile: Profile | None = None


def resolve_pair(
    *,
    profile: str | None = None,
    target: Path | None = None,
    draft: Path | None = None,
    offline: bool = False,
    progress: Callable | None = None,
) -> Pair:
    """Local ``target``/``draft`` files, or a profile's pair (downloaded and verified if not cached yet)."""
    if target is None and draft is not None:
        raise UsageError("--draft needs --target; or use --profile NAME")
    if target is not None:
        if profile is not None:
            raise UsageError("give either --profile or --target/--draft, not both")
        for path in (target, draft):
            if path is not None and not path.is_file():
                raise UsageError(f"{path} is not a file: give a local GGUF path")
        return Pair(target, draft, target.name)
    chosen = load_profile(profile or DEFAULT_PROFILE)
    target_path = store.resolve_model(chosen.target, offline=offline, progress=progress)
    draft_path = None if chosen.draft is None else store.resolve_model(chosen.draft, offline=offline, progress=progress)
    return Pair(target_path, draft_path, chosen.name, chosen)


def ensure_compatible(pair: Pair, *, force: bool = False) -> Report | None:
    """Run the checker on the pair; an incompatible pair is refused unless ``force``."""
    if pair.draft is None:
        read_header(pair.target)  # still validate the header before llama.cpp parses the file
        return None
    report = pair_report(pair.target, pair.draft)
    if not report.compatible and not force:
        raise IncompatibleError(
            f"target and draft are incompatible: {report.first_reason} "
            f"(details: localspec check {pair.target} {pair.draft}; --force to run anyway)"
        )
    return report


# A local GGUF path, an hf://OWNER/NAME/FILE reference, or a profile's ModelSpec.
ModelRef = Union[str, Path, ModelSpec]


def load_header(ref: ModelRef) -> tuple[dict[str, object], Path | None]:
    """The header of a local GGUF path, an ``hf://OWNER/NAME/FILE`` reference or a profile ModelSpec.

    Returns the metadata and the local file (for vocab-only loading) when there is one. Remote headers
    are read from a prefix fetched by the store, so nothing is downloaded in full.
    """
    if isinstance(ref, str) and ref.startswith(store.HF_SCHEME):
        ref = store.spec_from_uri(ref)
    if isinstance(ref, ModelSpec):
        cached = store.cached_path(ref)
        if cached is not None:
            return read_header(cached), cached
        return _remote_header(ref), None
    path = Path(ref)
    if not path.is_file():
        raise UsageError(f"{path} is not a file: give a local GGUF path, hf://OWNER/NAME/FILE or --profile NAME")
    return read_header(path), path


def _remote_header(spec: ModelSpec) -> dict[str, object]:
    try:
        return read_header_prefix(store.header_prefix(spec, FIRST_PREFIX_BYTES), what=spec.label)
    except GGUFTruncatedError:
        # Big vocabularies (Gemma's 262k tokens) outgrow the first fetch; one more, capped, is enough.
        return read_header_prefix(store.header_prefix(spec, MAX_HEADER_BYTES), what=spec.label)


def pair_report(target_ref: ModelRef, draft_ref: ModelRef) -> Report:
    """Check a pair given as local paths, ``hf://`` references or ModelSpecs (see ``load_header``)."""
    target_header, target_path = load_header(target_ref)
    draft_header, draft_path = load_header(draft_ref)
    return check_pair(target_header, draft_header, target_vocab_path=target_path, draft_vocab_path=draft_path,
                      open_tokenizer=VocabOnlyTokenizer)


def model_report(ref: ModelRef) -> Report:
    """One model alone, given as ``load_header`` takes it: its template, memory and drafting heads."""
    return check_model(load_header(ref)[0])


def open_decoder(
    pair: Pair, options: ModelOptions, *, method: str = "auto", draft_len: int | None = None, history: bool = True
) -> SpeculativeDecoder:
    """Load the target now and the draft on first use (``auto`` may never need it).

    With ``history``, earlier answers of this tokenizer are drafted from and this session's are added.
    The pass costs this machine measured in earlier sessions seed the controller; after each answer the
    session saves what it learnt (pass costs, the history).
    """
    target = Model(
        pair.target,
        n_ctx=options.n_ctx,
        n_threads=options.threads,
        n_gpu_layers=options.gpu_layers,
        exact=options.exact,
        rollback_snapshots=options.rollback_snapshots,
        load_mtp=uses(method, MtpDrafter.source),  # the model's own head, if it has one
        rpc=options.rpc,  # the draft model, heads and copies stay on this machine
    )
    # ggml's kernel switch is process-wide, so the draft runs whatever the target chose.
    draft_exact = target.kernels == EXACT
    draft = None
    ratio = DEFAULT_DRAFT_COST_RATIO
    # A draft file may be a companion head (EAGLE-3, DFlash): it drafts from the target's layers, not as a
    # model of its own.
    head = None if pair.draft is None else companion_head(pair.draft, read_header(pair.draft, check_tensors=False))
    if pair.draft is not None and head is None:
        draft_path = pair.draft

        def load_draft() -> Model:
            return Model(
                draft_path,
                n_ctx=options.n_ctx,
                n_threads=options.threads,
                n_gpu_layers=options.draft_gpu_layers,
                exact=draft_exact,
                # Its drafts come from one-token passes, which leave no snapshots to roll back through.
                rollback_snapshots=0,
            )

        draft = DraftModelDrafter(load_draft)
        # A decode step streams the weights once, so the file-size ratio is a fair first guess of the cost ratio.
        ratio = draft_path.stat().st_size / pair.target.stat().st_size
    answers = HistoryStore(paths.history_file(tokenizer_identity(target))) if history else None
    decoder = SpeculativeDecoder(
        target,
        draft=draft,
        method=method,
        draft_len=draft_len,
        draft_cost_ratio=ratio,
        # Loading reads and repacks the weights, so it takes about as long per byte as the target's did.
        draft_load_s=target.load_s * ratio,
        history=answers,
        head=head,
    )
    decoder.controller.remember(_pass_cost_memory(target).load())

    def save_what_was_learnt() -> None:
        if target.lost_server is not None:
            return  # an answer cut short by a lost RPC server: its passes and partial answer are not kept
        remember_pass_costs([decoder])
        if answers is not None:
            answers.save()

    decoder.on_answer = save_what_was_learnt
    return decoder


def close_decoder(decoder: SpeculativeDecoder) -> None:
    """Free a decoder ``open_decoder`` made and its target now, rather than when they are collected: freeing a
    model talks to its RPC servers, and at exit, after a bench's latency relays had stopped, that hung."""
    decoder.close()
    decoder.target.close()


def _pass_cost_memory(target: Model) -> PassCostMemory:
    return PassCostMemory(paths.pass_costs_file(), target.cost_identity())


def remember_pass_costs(decoders: Iterable[SpeculativeDecoder]) -> None:
    """Keep what ``decoders`` (a session's, or each of a bench's) measured of their target's passes for the
    next sessions on this machine."""
    for decoder in decoders:
        _pass_cost_memory(decoder.target).save(decoder.controller.costs.measured_costs())
