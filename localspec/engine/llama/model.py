"""The one module that touches llama-cpp-python internals.

``Model`` loads a GGUF and gives the engine exactly what speculative decoding needs: append tokens
to the KV cache and get back only the logits rows asked for (via the low-level batch API, so no
n_ctx x n_vocab score matrix is ever filled), roll the KV cache back to a position, and tokenize.
An upgrade of llama-cpp-python that moves these internals should break this file only. Which kernels
verify is kernels.py's, how memory rolls back memory.py's, the machine machine.py's.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import functools
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.engine.llama.kernels import EXACT, choose_kernels, exact_kernels_built, prefill_paths, use_kernels
from localspec.engine.llama.library import load_llama_cpp, loaded_cpu_library
from localspec.engine.llama.machine import cpu_model, default_threads, llama_cpp_version
from localspec.engine.llama.memory import DEFAULT_ROLLBACK_SNAPSHOTS, MemoryPlan
from localspec.engine.llama.rpc import (
    RpcLayout,
    RpcServerError,
    check_servers,
    device_array,
    forget_lost,
    lost_servers,
    server_devices,
)
from localspec.engine.tokens import common_prefix_length
from localspec.errors import ContextFullError, LocalspecError
from localspec.gguf.header import read_header
from localspec.gguf.memory import MemoryKind

DEFAULT_N_CTX = 4096
DEFAULT_N_BATCH = 512
# Prompt passes of at least this many tokens are timed and kept as `large_eval`, a cost hint for long drafts.
LARGE_EVAL = 64


@dataclass
class _Checkpoint:
    n_past: int
    state: ctypes.Array


class Model:
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
        load_mtp: bool = False,
        rpc: RpcLayout | None = None,
    ) -> None:
        """Load ``path``; with ``vocab_only`` just the tokenizer (no weights, no context: tokenize only).

        ``exact``: None picks bit-exact verification where it costs nothing, True forces it, False runs
        stock kernels (see ``choose_kernels``). ``rollback_snapshots``: recurrent-state snapshots to keep
        per pass where the architecture supports them (see DEFAULT_ROLLBACK_SNAPSHOTS). ``load_mtp``: load
        the model's built-in MTP head too (llama.cpp skips its tensors otherwise), for ``MtpHead``. ``rpc``:
        spread the layers over this machine and llama.cpp RPC servers (instead of any local GPU); the servers
        run the same patched build, so exact kernels stay exact there.
        """
        llama_cpp = load_llama_cpp()
        from llama_cpp import _internals as internals
        started = time.perf_counter()
        self._lib = llama_cpp
        threads = n_threads or default_threads()
        offloaded = rpc.offloaded_layers(_block_count(path)) if rpc is not None else 0
        self.kernels = choose_kernels(exact=exact, gpu_layers=0 if rpc is not None else n_gpu_layers)
        if not vocab_only:
            use_kernels(self.kernels)
        # Without the patch, exactness means the one-row paths only: no repacked weights (their 4-row gemm
        # sums in another order), no flash attention (split-KV and tiled paths), no GPU.
        slow_exact = self.kernels == EXACT and not exact_kernels_built()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0 if self.kernels == EXACT else n_gpu_layers
        self.rpc = rpc
        self.lost_server: str | None = None  # set once an RPC server is lost: this model never decodes again
        if rpc is not None:
            check_servers(rpc.servers)
            forget_lost(rpc.servers)  # lost by models that are gone; this one connects anew
            # Kept referenced: llama.cpp reads both arrays while loading.
            self._rpc_devices = device_array(server_devices(rpc.servers))
            self._rpc_split = (ctypes.c_float * llama_cpp.llama_max_devices())(*rpc.server_split())
            model_params.devices = ctypes.cast(self._rpc_devices, ctypes.c_void_p)
            model_params.tensor_split = self._rpc_split
            model_params.n_gpu_layers = offloaded
        model_params.use_extra_bufts = not slow_exact
        model_params.vocab_only = vocab_only
        model_params.load_mtp = load_mtp and not vocab_only
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
            context_params.n_rs_seq = rollback_snapshots if memory != MemoryKind.KV else 0
            if not vocab_only:
                self._ctx = internals.LlamaContext(model=self._model, params=context_params, verbose=False)
                self._batch = internals.LlamaBatch(n_tokens=n_batch, embd=0, n_seq_max=1, verbose=False)
        except ValueError as exc:
            if rpc is not None:
                self._check_servers_alive()
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
        self.n_embd: int = self._model.n_embd()
        self.n_embd_out: int = int(self._lib.llama_model_n_embd_out(self._model.model)) or self.n_embd
        self.tokens: list[int] = []
        self.large_eval: tuple[int, float] | None = None  # (tokens, seconds) of the latest large prompt pass
        self.last_rows = 0  # tokens of the latest pass (0: none yet)
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._vocab = self._model.vocab
        self.bos_id: int = self._model.token_bos()
        self.eos_id: int = self._model.token_eos()
        # What llama.cpp ends an infill with when nothing but end-of-generation is left: EOT, else EOS.
        eot = self._lib.llama_vocab_eot(self._vocab)
        self.end_of_text_id: int = eot if eot >= 0 else self.eos_id
        self.metadata: dict[str, str] = self._model.metadata()
        # MTP heads loaded with the model (0 unless load_mtp and the file has them).
        self.mtp_layers = int(llama_cpp.llama_model_n_layer_nextn(self._model.model)) if model_params.load_mtp else 0
        # With capture_hidden: row p is the last hidden state of the token at position p, written by every
        # pass over p, so rows below n_past always belong to the tokens the memory holds.
        self.hidden: np.ndarray | None = None
        # Per position, the inputs of the target layers an EAGLE-3 head reads, side by side (None: not kept).
        self.features: np.ndarray | None = None
        self._feature_layers: tuple[int, ...] = ()
        self._removable = 0  # trailing positions the last pass's snapshots can remove in place, once
        self._checkpoint: _Checkpoint | None = None
        self.replayed_tokens = 0  # tokens evaluated again because a rollback could not keep them
        self.memory_plan = MemoryPlan(MemoryKind.KV, 0, 0) if vocab_only else self._plan_memory(memory)
        self.load_s = time.perf_counter() - started  # prices loading a draft model of another size

    # -- tokenizer -------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]:
        return self._model.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def token_bytes(self, token: int) -> bytes:
        """The bytes a token stands for (special tokens render as their text)."""
        return self._piece(token, special=True)

    def text_piece(self, token: int) -> bytes:
        """The bytes a token adds to text, as llama.cpp's infill sampler compares them: nothing for a control
        token."""
        return self._piece(token, special=False)

    def _piece(self, token: int, *, special: bool) -> bytes:
        piece = self._pieces.get((token, special))
        if piece is None:
            size = 64
            buf = ctypes.create_string_buffer(size)
            n = self._lib.llama_token_to_piece(self._vocab, token, buf, size, 0, special)
            if n < 0:  # the piece is longer than the buffer: -n is the size needed
                buf = ctypes.create_string_buffer(-n)
                n = self._lib.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
            piece = self._pieces[token, special] = buf.raw[:n]
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

    def fim_tokens(self) -> dict[str, int | None]:
        """The fill-in-the-middle token ids ("pre", "suf", "mid", "rep", "sep"; None where the vocabulary has
        none), as llama.cpp's vocabulary resolves them: the GGUF's keys, else known token texts."""
        lib = self._lib
        found = {"pre": lib.llama_vocab_fim_pre(self._vocab), "suf": lib.llama_vocab_fim_suf(self._vocab),
                 "mid": lib.llama_vocab_fim_mid(self._vocab), "rep": lib.llama_vocab_fim_rep(self._vocab),
                 "sep": lib.llama_vocab_fim_sep(self._vocab)}
        return {role: token if token >= 0 else None for role, token in found.items()}  # LLAMA_TOKEN_NULL is -1

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
        if self.memory_plan.memory == MemoryKind.KV or drop <= self._removable:
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
        if self.memory_plan.memory == MemoryKind.KV:
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
        """What a saved state depends on: what sets the pass costs (weights, threads, kernels, build, CPU),
        the context's layout and the very library that computed it. A state saved under another identity is
        never restored."""
        cpu_lib = loaded_cpu_library()
        built = cpu_lib.stat() if cpu_lib is not None else None
        params = self._context_params
        return " | ".join(
            (
                self.cost_identity(),
                f"n_ctx {self.n_ctx} n_batch {self.n_batch} flash attention {params.flash_attn_type}",
                f"memory {self.memory_plan.memory} {self.memory_plan.snapshots}",
                f"{cpu_lib.name} {built.st_size} {built.st_mtime_ns}" if built else "no cpu backend",
            )
        )

    def can_remove(self, n: int) -> bool:
        """Whether the next pass's last ``n`` positions can be rolled back in place (no checkpoint needed)."""
        window = self.memory_plan.rollback_window
        return window is None or n <= window

    def reset(self) -> None:
        self.rollback(0)

    def _plan_memory(self, memory: MemoryKind) -> MemoryPlan:
        if memory == MemoryKind.KV:
            return MemoryPlan(MemoryKind.KV, 0, 0)
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
        if self.lost_server is not None:
            raise self._lost_error(self.lost_server)
        n = len(tokens)
        if n == 0 or not 0 <= n_logits <= min(n, self.n_batch):
            raise ValueError(f"eval of {n} tokens cannot return {n_logits} logits rows")
        if self.n_past + n > self.n_ctx:
            raise ContextFullError(f"context window full: {self.n_past} + {n} tokens > n_ctx {self.n_ctx}")
        first_logit = n - n_logits
        started = time.perf_counter()
        with prefill_paths(self.kernels) if prefill else contextlib.nullcontext():
            for start in range(0, n, self.n_batch):
                chunk = tokens[start : start + self.n_batch]
                self._decode(chunk, first_logit - start)
                self.tokens.extend(chunk)
                self.last_rows = len(chunk)
                # llama.cpp keeps the trailing n_rs_seq + 1 tokens of a pass in one ubatch, whose states
                # are the snapshots; the first of them has none before it within the pass.
                self._removable = min(self.memory_plan.snapshots, len(chunk) - 1)
                if progress is not None:
                    progress(start + len(chunk), n)
        if n >= LARGE_EVAL and prefill:
            self.large_eval = (n, time.perf_counter() - started)
        if n_logits == 0:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        rows = floats_at(self._lib.llama_get_logits(self._ctx.ctx), n_logits * self.n_vocab)
        return rows.reshape(n_logits, self.n_vocab).copy()

    def _decode(self, chunk: Sequence[int], first_logit: int) -> None:
        """One llama_decode over ``chunk``; positions at index >= first_logit produce logits."""
        batch = self._batch.batch
        n_past = self.n_past
        fill_batch(batch, chunk, n_past, first_logit)
        code = self._lib.llama_decode(self._ctx.ctx, batch)
        if self.rpc is not None:
            # Over several devices llama.cpp pipelines the pass and returns before the servers answer; wait for
            # them, so a server lost during this pass is known before its (zeroed) outputs are used.
            self._lib.llama_synchronize(self._ctx.ctx)
            self._check_servers_alive()
        if code == 0 and self.hidden is not None:
            self._keep_hidden(n_past, len(chunk))
        if code == 0 and self.features is not None:
            self._keep_features(n_past, len(chunk))
        if code != 0:
            # The memory may hold part of the chunk; drop it so `tokens` stays the truth. A recurrent state
            # cannot say how far it got, so it starts over.
            self._removable = 0
            if self.memory_plan.memory == MemoryKind.KV:
                self._lib.llama_memory_seq_rm(self._ctx.memory, 0, n_past, -1)
            else:
                self._lib.llama_memory_clear(self._ctx.memory, True)
                self.tokens.clear()
                self._checkpoint = None
            raise LocalspecError(f"llama_decode failed with code {code} at position {n_past}")

    def _check_servers_alive(self) -> None:
        """Raise if an RPC server was lost during the last call: what it computed (zeroed answers) is not kept."""
        lost = lost_servers(self.rpc.servers) if self.rpc is not None else []
        if lost:
            self.lost_server = lost[0]
            self.tokens.clear()
            raise self._lost_error(lost[0])

    def _lost_error(self, server: str) -> RpcServerError:
        return RpcServerError(server, f"RPC server {server} was lost (it stopped or gave no answer for "
                              f"{_rpc_timeout_s():g} s); restart it and try again")

    def capture_hidden(self) -> None:
        """From now on keep every pass's last hidden state per position in ``hidden`` (what an MTP head
        reads). The last layer then runs on every token of a prompt, not only the last one."""
        if self.hidden is None:
            self.reset()  # what the memory holds now was evaluated without them
            llama_cpp_ext().llama_set_embeddings_nextn(self._ctx.ctx, True, False)
            self.hidden = np.zeros((0, self.n_embd_out), dtype=np.float32)

    @property
    def n_params(self) -> int:
        return int(self._model.n_params())

    @property
    def n_layers(self) -> int:
        """Trunk layers (an MTP head's block not counted)."""
        return int(self._lib.llama_model_n_layer(self._model.model))

    @property
    def keeps_head_inputs(self) -> bool:
        return self.hidden is not None or self.features is not None

    def capture_layer_inputs(self, layers: Sequence[int]) -> None:
        """From now on keep, per position, the inputs of trunk ``layers`` side by side in ``features`` (what
        an EAGLE-3 head reads); the target's graph must expose them (gguf/heads.py lists which do)."""
        if self.features is None:
            self.reset()  # what the memory holds now was evaluated without them
            keep, _ = _layer_input_calls()
            for layer in layers:
                keep(self._ctx.ctx, layer, True)
            self._feature_layers = tuple(layers)
            self.features = np.zeros((0, len(layers) * self.n_embd), dtype=np.float32)

    def _keep_hidden(self, n_past: int, n: int) -> None:
        pointer = llama_cpp_ext().llama_get_embeddings_nextn(self._ctx.ctx)
        self.hidden = self._grown(self.hidden, n_past + n)
        self.hidden[n_past : n_past + n] = floats_at(pointer, n * self.n_embd_out).reshape(n, -1)

    def _keep_features(self, n_past: int, n: int) -> None:
        _, read = _layer_input_calls()
        self.features = self._grown(self.features, n_past + n)
        width = self.n_embd
        for i, layer in enumerate(self._feature_layers):
            self.features[n_past : n_past + n, i * width : (i + 1) * width] = floats_at(
                read(self._ctx.ctx, layer), n * width).reshape(n, width)

    def _grown(self, rows: np.ndarray, needed: int) -> np.ndarray:
        """``rows`` with room for ``needed`` positions: grown by doubling, up to the context size."""
        if len(rows) >= needed:
            return rows
        grown = np.zeros((min(self.n_ctx, max(2 * len(rows), needed, 64)), rows.shape[1]), np.float32)
        grown[: len(rows)] = rows
        return grown

    def cost_identity(self) -> str:
        """What sets this model's pass costs on this machine: file, threads, offload, kernels, build, CPU."""
        stat = self.path.stat()
        return " | ".join(
            (
                f"{self.path.name} {stat.st_size} {stat.st_mtime_ns}",
                f"threads {self.n_threads}",
                f"gpu layers {self.n_gpu_layers}",
                # A pass over RPC pays round trips too: a one-machine curve must never price it, nor the reverse.
                *([self.rpc.identity()] if self.rpc is not None else []),
                f"kernels {self.kernels}",
                f"llama-cpp-python {llama_cpp_version()}",
                cpu_model(),
                # Snapshots are written on every pass; a dense model's identity stays as it was.
                *([f"memory {self.memory_plan.method} {self.memory_plan.snapshots}"] if self.memory_plan.memory != MemoryKind.KV else []),
            )
        )

    def another_context(self) -> Model:
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
        other.last_rows = 0
        other._removable = 0
        other._checkpoint = None
        other.replayed_tokens = 0
        other.hidden = None
        other.features = None
        other._feature_layers = ()
        return other

    def close(self) -> None:
        for part in ("_batch", "_ctx") if self._shares_model else ("_batch", "_ctx", "_model"):
            if hasattr(self, part):
                getattr(self, part).close()


def fill_batch(batch, tokens: Sequence[int], n_past: int, first_logit: int) -> None:
    """One sequence's ``tokens`` at positions from ``n_past``; those at index >= first_logit produce logits."""
    batch.n_tokens = len(tokens)
    for i, token in enumerate(tokens):
        batch.token[i] = token
        batch.pos[i] = n_past + i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = i >= first_logit


def floats_at(pointer, count: int) -> np.ndarray:
    """A float32 view of the first ``count`` floats of a llama.cpp output buffer (logits, hidden states,
    layer inputs) at ``pointer``, good until the next pass: copy what is kept. llama.cpp keeps its output
    buffers from pass to pass, so each buffer's view is made once; made on every pass (``as_array``), the
    views of SmolLM2's logits and an EAGLE-3 head's three layer inputs took ~40 µs of a 9 ms pass."""
    return _view(ctypes.cast(pointer, ctypes.c_void_p).value, count)


@functools.lru_cache(maxsize=256)
def _view(address: int, count: int) -> np.ndarray:
    return np.frombuffer((ctypes.c_float * count).from_address(address), np.float32)


@functools.cache
def _layer_input_calls():
    """(keep, read): llama.cpp's staging calls that keep a layer's input per token during a pass and read
    them back (llama-ext.h: what an EAGLE-3 head reads). The pinned binding leaves them out, so they are
    resolved here by their exported names, as its own llama_cpp_ext resolves its functions."""
    ext = llama_cpp_ext()
    context = ext.llama_cpp.llama_context_p_ctypes

    @ext._ctypes_function_from_names(
        ("llama_set_embeddings_layer_inp", "_Z30llama_set_embeddings_layer_inpP13llama_contextjb"),
        [context, ctypes.c_uint32, ctypes.c_bool], None,
    )
    def keep(ctx, layer: int, value: bool, /) -> None: ...

    @ext._ctypes_function_from_names(
        ("llama_get_embeddings_layer_inp", "_Z30llama_get_embeddings_layer_inpP13llama_contextj"),
        [context, ctypes.c_uint32], ctypes.POINTER(ctypes.c_float),
    )
    def read(ctx, layer: int, /): ...

    return keep, read


def llama_cpp_ext():
    """llama-cpp-python's bindings of llama.cpp's staging API (the MTP head's), imported on first use."""
    from llama_cpp import llama_cpp_ext as ext

    return ext


def _block_count(path: str | Path) -> int:
    """The target's layer count from its header (the RPC split is sized before llama.cpp loads it)."""
    header = read_header(path, check_tensors=False)
    count = header.get(f"{header.get('general.architecture')}.block_count")
    if not isinstance(count, int) or count <= 0:
        raise LocalspecError(f"{Path(path).name} does not say how many layers it has; it cannot be spread over RPC")
    return count


def _rpc_timeout_s() -> float:
    return int(os.environ.get("GGML_RPC_TIMEOUT_MS", "0")) / 1000


def _memory_kind(llama_cpp, model) -> MemoryKind:
    if llama_cpp.llama_model_is_hybrid(model):
        return MemoryKind.HYBRID
    return MemoryKind.RECURRENT if llama_cpp.llama_model_is_recurrent(model) else MemoryKind.KV
