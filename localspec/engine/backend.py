"""The one module that touches llama-cpp-python internals.

``LlamaModel`` loads a GGUF and gives the engine exactly what speculative decoding needs: append tokens
to the KV cache and get back only the logits rows asked for (via the low-level batch API, so no
n_ctx x n_vocab score matrix is ever filled), roll the KV cache back to a position, and tokenize.
An upgrade of llama-cpp-python that moves these internals should break this file only.
"""

from __future__ import annotations

import copy
import ctypes
import functools
import importlib.metadata
import os
import platform
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.errors import ContextFullError, LocalspecError

DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 512
# Recurrent-state snapshots kept per pass where the architecture supports them (llama.cpp's n_rs_seq), so a
# verification of up to that many drafts rolls back in place. Off by default: every pass then writes its
# snapshots, and at Qwen3.5 0.8B's shapes 8 of them slow even a one-token pass by ~8% (the target alone
# would run slower than stock llama.cpp's), while a checkpoint costs ~6% of a one-token pass per
# verification plus a replay after a rejection, and only when speculating (scripts/bench_rollback.py).
DEFAULT_ROLLBACK_SNAPSHOTS = 0
# Evals of at least this many tokens are timed and kept as `large_eval`, a cost anchor for long drafts.
LARGE_EVAL = 64


_log_callback = None  # kept referenced: llama.cpp holds a raw pointer to it


def _quiet_llama_logs(llama_cpp) -> None:
    """Send llama.cpp's log to stderr only with LOCALSPEC_DEBUG set.

    llama-cpp-python's own callback maps ggml's log levels with an outdated table, so warnings such as
    "n_ctx_seq > n_ctx_train" reach the terminal even with verbose=False.
    """
    global _log_callback
    if _log_callback is not None:
        return

    @llama_cpp.llama_log_callback
    def callback(level, text, user_data):
        if os.environ.get("LOCALSPEC_DEBUG"):
            sys.stderr.write(text.decode("utf-8", "replace"))

    _log_callback = callback
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))


# How batched verification relates to one-token decoding (see the README, "Exact or fast kernels").
EXACT = "exact"  # bit-identical: greedy output equals the target's, token for token
FAST = "fast"  # stock kernels: lossless up to floating-point rounding, measured not promised
# Exact kernels keep batches up to this size invariant; larger ones (prompt prefill) take faster kernels.
# Must equal GGML_EXACT_VERIFY_MAX in scripts/patches/llama-cpp-exact.patch.
MAX_VERIFY_BATCH = 128
_EXACT_SYMBOL = "ggml_tiled_exact_mode"  # exported by scripts/patches/llama-cpp-exact.patch
_kernels_in_process: str | None = None  # ggml reads GGML_CPU_TILED_MM once, at the first matmul


def _import_llama_cpp():
    import llama_cpp
    from llama_cpp import _internals

    _quiet_llama_logs(llama_cpp)
    return llama_cpp, _internals


def _lib_dir() -> Path:
    """Where llama-cpp-python loads llama.cpp's shared libraries from (it honours LLAMA_CPP_LIB_PATH too)."""
    llama_cpp, _ = _import_llama_cpp()
    return Path(os.environ.get("LLAMA_CPP_LIB_PATH") or Path(llama_cpp.__file__).parent / "lib")


def _loaded_cpu_library() -> Path | None:
    """The file llama.cpp's CPU backend runs from. A wheel holds libggml-cpu.so, .so.0 and .so.0.x as separate
    copies on Linux, and another copy than the one llama.cpp loaded would have globals of its own."""
    lib_dir = _lib_dir()  # imports llama_cpp, which loads the backend
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and Path(fields[5]).name.startswith("libggml-cpu."):
                return Path(fields[5])
    for name in ("libggml-cpu.so", "libggml-cpu.dylib", "ggml-cpu.dll"):
        if (lib_dir / name).exists():
            return lib_dir / name
    return None


@functools.cache
def _patched_cpu_lib() -> ctypes.CDLL | None:
    """llama.cpp's CPU backend library when it carries localspec's patch, else None."""
    path = _loaded_cpu_library()
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


def choose_kernels(*, exact: bool | None, gpu_layers: int) -> str:
    """EXACT where it costs nothing (a patched build on the CPU), FAST elsewhere unless ``exact`` forces it.

    GPU backends are not checked for batch invariance, so a forced exact run keeps the target on the CPU.
    """
    if exact is not None:
        return EXACT if exact else FAST
    llama_cpp, _ = _import_llama_cpp()
    on_gpu = gpu_layers != 0 and bool(llama_cpp.llama_supports_gpu_offload())
    return EXACT if exact_kernels_built() and not on_gpu else FAST


def kernels_description(kernels: str) -> str:
    """One line for doctor and the live view: which kernels verify, and what that promises."""
    if kernels == FAST:
        return "fast: stock llama.cpp kernels, lossless up to floating-point rounding (--exact for bit-identity)"
    if exact_kernels_built():
        return "exact: batch-invariant kernels at stock speed, verified tokens bit-identical to one-token decoding"
    return "exact: stock kernels' one-row paths only (this build lacks localspec's patch), bit-identical but slower"


def _use_kernels(kernels: str) -> None:
    """Set ggml's process-wide kernel switch for ``kernels``, once per process."""
    global _kernels_in_process
    if _kernels_in_process not in (None, kernels):
        raise LocalspecError(
            f"this process already runs llama.cpp with {_kernels_in_process} kernels and cannot switch to "
            f"{kernels}; start a new process for the other mode"
        )
    if kernels == EXACT:
        # A patched build: its batch-invariant kernels. An unpatched one reads "exact" as 0: vec_dot only.
        os.environ["GGML_CPU_TILED_MM"] = "exact"
    else:
        os.environ.pop("GGML_CPU_TILED_MM", None)
    os.environ.pop("GGML_CPU_TILED_MM_FORCE", None)
    _kernels_in_process = kernels


def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module knows."""
    try:
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        match = None
    return match.group(1).strip() if match else platform.processor() or platform.machine()


def default_threads() -> int:
    """All usable cores on small machines; half of them (physical cores, usually) on larger ones."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return n if n <= 4 else n // 2


# What a model's memory is, and so how positions are taken back out of it (see LlamaModel.rollback).
KV = "kv"  # attention only: llama.cpp cuts any trailing positions out of the KV cache
HYBRID = "hybrid"  # attention beside a recurrent state (Qwen3.5/3.6, LFM2, Nemotron-H, Granite 4)
RECURRENT = "recurrent"  # a recurrent state only (Mamba, RWKV)
# How the rejected drafts of a verification leave a recurrent state.
SNAPSHOTS = "snapshots"  # per-token snapshots of the last pass (n_rs_seq): removed in place, for free
CHECKPOINT = "checkpoint"  # the state saved before the pass, restored, and the accepted tokens replayed


@dataclass(frozen=True)
class MemoryPlan:
    """How a loaded model's memory rolls back, for the controller's prices and for people to read."""

    memory: str  # KV, HYBRID or RECURRENT
    snapshots: int  # trailing positions of one pass removable in place (n_rs_seq); unlimited for KV
    checkpoint_bytes: int  # one saved recurrent state (0 for KV)
    refused: str | None = None  # why no rollback works at all: speculation is off for this model

    @property
    def rollback_window(self) -> int | None:
        """Rejected drafts one pass can drop in place: any for a KV cache (None), else its snapshots."""
        return None if self.memory == KV else self.snapshots

    @property
    def method(self) -> str:
        """How a verification's rejected drafts are removed: KV, SNAPSHOTS (then CHECKPOINT past them), or
        CHECKPOINT."""
        if self.memory == KV:
            return KV
        return SNAPSHOTS if self.snapshots else CHECKPOINT

    def describe(self) -> str:
        if self.memory == KV:
            return "kv: KV cache only, rejected drafts are cut out in place"
        if self.refused:
            return f"{self.memory}: no speculation ({self.refused})"
        state = f"{self.checkpoint_bytes / 2**20:.1f} MiB per recurrent state"
        if self.snapshots:
            return (
                f"{self.memory}: {self.snapshots} snapshots per pass ({self.snapshots * self.checkpoint_bytes / 2**20:.0f} MiB), "
                f"longer drafts checkpoint and replay; {state}"
            )
        return f"{self.memory}: checkpoint before each verification, replay the accepted tokens; {state}"


@dataclass
class _Checkpoint:
    n_past: int
    state: ctypes.Array


class LlamaModel:
    """A GGUF model with its own context and KV cache, driven token batch by token batch.

    ``tokens`` mirrors what the KV cache holds, so callers can reuse a common prefix across calls.
    Hybrid and recurrent models keep a recurrent state that llama.cpp cannot cut arbitrary positions out
    of; ``rollback`` still always reaches the position asked for (see there), and ``memory_plan`` says how.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        n_gpu_layers: int = 0,
        n_batch: int = DEFAULT_N_BATCH,
        vocab_only: bool = False,
        exact: bool | None = None,
        rollback_snapshots: int = DEFAULT_ROLLBACK_SNAPSHOTS,
    ) -> None:
        """Load ``path``; with ``vocab_only`` just the tokenizer (no weights, no context: tokenize only).

        ``exact``: None picks bit-exact verification where it costs nothing, True forces it, False runs
        stock kernels (see ``choose_kernels``). ``rollback_snapshots``: recurrent-state snapshots to keep
        per pass where the architecture supports them (see DEFAULT_ROLLBACK_SNAPSHOTS).
        """
        llama_cpp, internals = _import_llama_cpp()
        started = time.perf_counter()
        self._lib = llama_cpp
        threads = n_threads or default_threads()
        self.kernels = choose_kernels(exact=exact, gpu_layers=n_gpu_layers)
        if not vocab_only:
            _use_kernels(self.kernels)
        # Without the patch, exactness means the one-row paths only: no repacked weights (their 4-row gemm
        # sums in another order), no flash attention (split-KV and tiled paths), no GPU.
        slow_exact = self.kernels == EXACT and not exact_kernels_built()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0 if self.kernels == EXACT else n_gpu_layers
        model_params.use_extra_bufts = not slow_exact
        model_params.vocab_only = vocab_only
        context_params = llama_cpp.llama_context_default_params()
        context_params.n_ctx = n_ctx
        context_params.n_batch = context_params.n_ubatch = n_batch
        context_params.n_threads = context_params.n_threads_batch = threads
        if slow_exact:
            context_params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        elif self.kernels == EXACT:
            context_params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        context_params.no_perf = True
        try:
            self._model = internals.LlamaModel(path_model=str(path), params=model_params, verbose=False)
            memory = _memory_kind(llama_cpp, self._model.model)
            # llama.cpp clamps n_rs_seq to 0 for architectures without snapshot support.
            context_params.n_rs_seq = rollback_snapshots if memory != KV else 0
            if not vocab_only:
                self._ctx = internals.LlamaContext(model=self._model, params=context_params, verbose=False)
                self._batch = internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        except ValueError as exc:
            raise LocalspecError(f"llama.cpp could not load {path}: {exc}; run 'localspec check' on it") from exc
        self._internals = internals
        self._context_params = context_params
        self._shares_model = False
        self.path = Path(path)
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        self.n_threads = threads
        self.n_gpu_layers = model_params.n_gpu_layers
        self.n_vocab: int = self._model.n_vocab()
        self.tokens: list[int] = []
        self.large_eval: tuple[int, float] | None = None  # (tokens, seconds) of the latest large eval
        self._pieces: dict[int, bytes] = {}
        self._vocab = self._model.vocab
        self.bos_id: int = self._model.token_bos()
        self.eos_id: int = self._model.token_eos()
        self.metadata: dict[str, str] = self._model.metadata()
        self._removable = 0  # trailing positions the last pass's snapshots can remove in place, once
        self._checkpoint: _Checkpoint | None = None
        self.replayed_tokens = 0  # tokens evaluated again because a rollback could not keep them
        self.memory_plan = MemoryPlan(KV, 0, 0) if vocab_only else self._plan_memory(memory)
        self.load_s = time.perf_counter() - started  # prices loading a draft model of another size

    # -- tokenizer -------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as their text)."""
        piece = self._pieces.get(token)
        if piece is None:
            size = 64
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_token_to_piece(self._vocab, token, buf, size, 0, True)
            if n < 0:  # the piece is longer than the buffer: -n is the size needed
                buf = ctypes.create_string_buffer(-n)
                n = self._lib.llama_token_to_piece(self._vocab, token, buf, -n, 0, True)
            piece = self._pieces[token] = buf.raw[:n]
        return piece

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def is_end_of_generation(self, token: int) -> bool:
        return bool(self._lib.llama_vocab_is_eog(self._vocab, token))

    @property
    def vocab_handle(self):
        """The llama.cpp vocab pointer, for libraries that read it (llguidance's tokenizer)."""
        return self._vocab

    @property
    def add_bos(self) -> bool:
        return bool(self._lib.llama_vocab_get_add_bos(self._vocab))

    # -- KV cache --------------------------------------------------------------------------------
    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def rollback(self, n_past: int) -> float:
        """Make the memory hold exactly the first ``n_past`` tokens; returns the seconds it took.

        A KV cache cuts the rest out. A recurrent state is rolled back in place when the last pass's
        snapshots reach (once per pass), else restored from the checkpoint, if one was saved at or before
        ``n_past``, and the tokens after it evaluated again, else cleared and re-evaluated from the start
        (``replayed_tokens`` counts those). It never continues from a state built on removed tokens.
        """
        drop = len(self.tokens) - n_past
        if drop <= 0:
            return 0.0
        started = time.perf_counter()
        memory = self._ctx.memory
        if self.memory_plan.memory == KV or drop <= self._removable:
            if not self._lib.llama_memory_seq_rm(memory, 0, n_past, -1):
                raise LocalspecError(f"llama.cpp refused to roll {self.path.name} back to position {n_past}")
            del self.tokens[n_past:]
            self._removable = 0  # llama.cpp takes one snapshot rollback per pass
            return time.perf_counter() - started
        checkpoint = self._checkpoint
        if checkpoint is not None and checkpoint.n_past <= n_past:
            state = checkpoint.state
            flags = self._lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
            if self._lib.llama_state_seq_set_data_ext(self._ctx.ctx, state, len(state), 0, flags) != len(state):
                raise LocalspecError(f"llama.cpp could not restore the state of {self.path.name}")
            start = checkpoint.n_past
        else:
            start = 0
        # The restored state is at ``start``; attention caches still hold cells past it.
        if not self._lib.llama_memory_seq_rm(memory, 0, start, -1):
            raise LocalspecError(f"llama.cpp refused to clear {self.path.name} from position {start}")
        replay = self.tokens[start:n_past]
        del self.tokens[start:]
        self._removable = 0
        if replay:
            # A replay from a checkpoint stands in for a verification (exact kernels); from the start it is
            # a prompt prefill, as a new request would do.
            self.eval(replay, n_logits=0, prefill=start == 0)
            self.replayed_tokens += len(replay)
        return time.perf_counter() - started

    def checkpoint(self) -> float:
        """Save the recurrent state at the current position, so a later rollback to it or past it can
        restore it; returns the seconds it took. A no-op for a KV cache, which rolls back anywhere."""
        if self.memory_plan.memory == KV:
            return 0.0
        started = time.perf_counter()
        reuse = self._checkpoint.state if self._checkpoint is not None else None
        self._checkpoint = None  # until the new one is whole
        self._checkpoint = _Checkpoint(self.n_past, self._save_state(reuse))
        return time.perf_counter() - started

    def _save_state(self, buffer: ctypes.Array | None = None) -> ctypes.Array:
        """The recurrent state as llama.cpp saves it, into ``buffer`` if it is the right size."""
        flags = self._lib.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
        size = self._lib.llama_state_seq_get_size_ext(self._ctx.ctx, 0, flags)
        if buffer is None or len(buffer) != size:
            buffer = (ctypes.c_uint8 * size)()
        if self._lib.llama_state_seq_get_data_ext(self._ctx.ctx, buffer, size, 0, flags) != size:
            raise LocalspecError(f"llama.cpp could not save the state of {self.path.name}")
        return buffer

    def prompt_state_size(self) -> int:
        """The bytes ``save_prompt_state`` would return now."""
        return self._lib.llama_state_seq_get_size_ext(self._ctx.ctx, 0, 0)

    def save_prompt_state(self) -> bytearray:
        """The whole memory (KV cells and any recurrent state) holding ``tokens``, for the prompt cache.

        Unlike a checkpoint it keeps the attention cells too, so ``restore_prompt_state`` alone brings the
        model back to this position, in this context or in another process with the same ``state_identity``.
        """
        size = self.prompt_state_size()
        state = bytearray(size)
        buffer = (ctypes.c_uint8 * size).from_buffer(state)
        if self._lib.llama_state_seq_get_data_ext(self._ctx.ctx, buffer, size, 0, 0) != size:
            raise LocalspecError(f"llama.cpp could not save the state of {self.path.name}")
        return state

    def restore_prompt_state(self, tokens: Sequence[int], state: bytearray) -> None:
        """Make the memory hold ``tokens`` from what ``save_prompt_state`` gave when it held exactly them."""
        self._removable = 0
        self._checkpoint = None  # saved on top of the memory being replaced
        buffer = (ctypes.c_uint8 * len(state)).from_buffer(state)
        if self._lib.llama_state_seq_set_data_ext(self._ctx.ctx, buffer, len(state), 0, 0) != len(state):
            # A failed read may have restored part of it: start over rather than trust either state.
            self._lib.llama_memory_clear(self._ctx.memory, True)
            self.tokens.clear()
            raise LocalspecError(f"llama.cpp could not restore a saved state of {self.path.name}")
        self.tokens = list(tokens)

    def state_identity(self) -> str:
        """What a saved state depends on: the weights, the context's layout, the kernels that computed it,
        the build that wrote it. A state saved under another identity is never restored."""
        stat = self.path.stat()
        cpu_lib = _loaded_cpu_library()
        built = cpu_lib.stat() if cpu_lib is not None else None
        params = self._context_params
        return " | ".join(
            (
                f"{self.path.name} {stat.st_size} {stat.st_mtime_ns}",
                f"n_ctx {self.n_ctx} n_batch {self.n_batch} flash attention {params.flash_attn_type}",
                f"memory {self.memory_plan.memory} {self.memory_plan.snapshots}",
                f"threads {self.n_threads} gpu layers {self.n_gpu_layers} kernels {self.kernels}",
                f"llama-cpp-python {importlib.metadata.version('llama-cpp-python')}",
                f"{cpu_lib.name} {built.st_size} {built.st_mtime_ns}" if built else "no cpu backend",
                cpu_model(),
            )
        )

    def can_remove(self, n: int) -> bool:
        """Whether the next pass's last ``n`` positions can be rolled back in place (no checkpoint needed)."""
        window = self.memory_plan.rollback_window
        return window is None or n <= window

    def reset(self) -> None:
        self.rollback(0)

    def _plan_memory(self, memory: str) -> MemoryPlan:
        if memory == KV:
            return MemoryPlan(KV, 0, 0)
        snapshots = int(self._lib.llama_n_rs_seq(self._ctx.ctx))
        # Save the state after one token (an empty one has no cells to save): it proves checkpoints work
        # here and sizes one.
        self._decode([max(self.bos_id, 0)], first_logit=1)
        try:
            size = len(self._save_state())
        except LocalspecError:
            size = 0
        finally:
            self._lib.llama_memory_clear(self._ctx.memory, True)
        if not size:
            return MemoryPlan(memory, 0, 0, refused="llama.cpp can neither cut nor save its recurrent state")
        return MemoryPlan(memory, snapshots, size)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the KV cache already holds."""
        return common_prefix_length(self.tokens, tokens)

    # -- evaluation ------------------------------------------------------------------------------
    def eval(self, tokens: Sequence[int], *, n_logits: int = 1, progress=None, prefill: bool = False) -> np.ndarray:
        """Append ``tokens`` to the KV cache and return the logits of the last ``n_logits`` of them.

        Returns an (n_logits, n_vocab) float32 array; row i predicts the token after
        ``tokens[len(tokens) - n_logits + i]``. ``progress(done, total)`` is called between chunks.
        ``prefill`` says the tokens are a prompt, not a verification: the exact kernels then take their
        faster prefill paths at any batch size (a prompt is prefilled the same way on every decoding path).
        """
        n = len(tokens)
        if n == 0 or not 0 <= n_logits <= min(n, self.n_batch):
            raise ValueError(f"eval of {n} tokens cannot return {n_logits} logits rows")
        if self.n_past + n > self.n_ctx:
            raise ContextFullError(
                f"context window full: {self.n_past} + {n} tokens > n_ctx {self.n_ctx}; "
                "use a larger --ctx or a shorter prompt"
            )
        first_logit = n - n_logits
        started = time.perf_counter()
        switch = _patched_cpu_lib() if prefill and self.kernels == EXACT else None
        if switch is not None:
            switch.ggml_exact_set_prefill(True)
        try:
            for start in range(0, n, self.n_batch):
                chunk = tokens[start : start + self.n_batch]
                self._decode(chunk, first_logit - start)
                self.tokens.extend(chunk)
                # llama.cpp keeps the trailing n_rs_seq + 1 tokens of a pass in one ubatch, whose states
                # are the snapshots; the first of them has none before it within the pass.
                self._removable = min(self.memory_plan.snapshots, len(chunk) - 1)
                if progress is not None:
                    progress(start + len(chunk), n)
        finally:
            if switch is not None:
                switch.ggml_exact_set_prefill(False)
        if n >= LARGE_EVAL:
            self.large_eval = (n, time.perf_counter() - started)
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        ptr = self._lib.llama_get_logits(self._ctx.ctx)
        rows = np.ctypeslib.as_array(ptr, shape=(n_logits * self.n_vocab,))
        return rows.reshape(n_logits, self.n_vocab).copy()

    def _decode(self, chunk: Sequence[int], first_logit: int) -> None:
        """One llama_decode over ``chunk``; positions at index >= first_logit produce logits."""
        batch = self._batch.batch
        n_past = self.n_past
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_logit
        code = self._lib.llama_decode(self._ctx.ctx, batch)
        if code != 0:
            # The memory may hold part of the chunk; drop it so `tokens` stays the truth. A recurrent state
            # cannot say how far it got, so it starts over.
            self._removable = 0
            if self.memory_plan.memory == KV:
                self._lib.llama_memory_seq_rm(self._ctx.memory, 0, n_past, -1)
            else:
                self._lib.llama_memory_clear(self._ctx.memory, True)
                self.tokens.clear()
                self._checkpoint = None
            raise LocalspecError(f"llama_decode failed with code {code} at position {n_past}")

    def cost_identity(self) -> str:
        """What sets this model's pass costs on this machine: file, threads, offload, kernels, build, CPU."""
        stat = self.path.stat()
        return " | ".join(
            (
                f"{self.path.name} {stat.st_size} {stat.st_mtime_ns}",
                f"threads {self.n_threads}",
                f"gpu layers {self.n_gpu_layers}",
                f"kernels {self.kernels}",
                f"llama-cpp-python {importlib.metadata.version('llama-cpp-python')}",
                cpu_model(),
                # Snapshots are written on every pass; a dense model's identity stays as it was.
                *([f"memory {self.memory_plan.method} {self.memory_plan.snapshots}"] if self.memory_plan.memory != KV else []),
            )
        )

    def another_context(self) -> LlamaModel:
        """The same loaded weights with a context and KV cache of their own, empty.

        Several generations can then advance turn about, each on its own cache (the benchmark runs its
        configurations so, round by round, so a slow spell of the machine hits them all alike).
        """
        other = copy.copy(self)
        other._ctx = self._internals.LlamaContext(model=self._model, params=self._context_params, verbose=False)
        other._batch = self._internals.LlamaBatch(n_tokens=self.n_batch, embd=0, n_seq_max=1, verbose=False)
        other._shares_model = True
        other.tokens = []
        other.large_eval = None
        other._removable = 0
        other._checkpoint = None
        other.replayed_tokens = 0
        return other

    def close(self) -> None:
        for part in ("_batch", "_ctx") if self._shares_model else ("_batch", "_ctx", "_model"):
            if hasattr(self, part):
                getattr(self, part).close()


def _memory_kind(llama_cpp, model) -> str:
    if llama_cpp.llama_model_is_hybrid(model):
        return HYBRID
    return RECURRENT if llama_cpp.llama_model_is_recurrent(model) else KV


# The AMX backend's own symbols/buffer-type name; "ggml_cpu_has_amx_int8" alone is only a feature probe.
_AMX_BACKEND = re.compile(rb"ggml_backend_amx|\x00AMX\x00")


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
    llama_cpp, _ = _import_llama_cpp()
    system_info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    lib_dir = _lib_dir()
    return BuildInfo(
        version=importlib.metadata.version("llama-cpp-python"),
        module=llama_cpp.__file__,
        system_info=system_info,
        gpu_offload=gpu_backends(lib_dir, system_info) if llama_cpp.llama_supports_gpu_offload() else None,
        kernels=choose_kernels(exact=None, gpu_layers=0),
        amx_backend=has_amx_backend(lib_dir, system_info),
    )


def has_amx_backend(lib_dir: Path, system_info: str) -> bool:
    """True when the build compiled AMX kernels: reported in system info or present in the shared libraries."""
    if re.search(r"AMX\w* = 1", system_info):
        return True
    return any(_AMX_BACKEND.search(lib.read_bytes()) for lib in sorted(lib_dir.glob("*.so*")) + sorted(lib_dir.glob("*.dylib")))


def gpu_backends(lib_dir: Path, system_info: str) -> str:
    names = [name for name in ("CUDA", "Metal", "Vulkan", "HIP", "SYCL") if name.lower() in system_info.lower()]
    names += [lib.name for lib in lib_dir.glob("libggml-*") if any(n in lib.name for n in ("cuda", "metal", "vulkan", "hip"))]
    return ", ".join(dict.fromkeys(names)) or "compiled in"


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (what a cache can keep)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
