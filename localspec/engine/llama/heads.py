"""The drafting heads' own contexts beside the target's: the MTP head built into a model, and the companion
EAGLE-3 and DFlash head files. Part of the llama.cpp door (they touch llama-cpp-python's internals as
model.py does)."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localspec.engine.llama.model import Model, fill_batch, floats_at, llama_cpp_ext
from localspec.engine.tokens import common_prefix_length
from localspec.errors import LocalspecError


class _HeadCache:
    """A drafting head's own KV cache beside the target's. ``tokens`` mirrors its entries (the token each is
    judged by); the memory is a plain KV cache, so it rolls back anywhere. Subclasses open ``_ctx`` and set
    ``_lib`` and ``_name``."""

    def _decode(self, batch, n_past: int) -> None:
        code = self._lib.llama_decode(self._ctx.ctx, batch)
        if code != 0:
            self._lib.llama_memory_seq_rm(self._ctx.memory, 0, n_past, -1)
            raise LocalspecError(f"llama_decode of {self._name} failed with code {code} at position {n_past}")

    def rollback(self, n_past: int) -> None:
        if n_past < len(self.tokens):
            if not self._lib.llama_memory_seq_rm(self._ctx.memory, 0, n_past, -1):
                raise LocalspecError(f"llama.cpp refused to roll {self._name} back to position {n_past}")
            del self.tokens[n_past:]

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix_length(self.tokens, tokens)


class _HeadContext(_HeadCache):
    """A chained head's context: each KV entry is built from a token and a state row (the target's, or the
    head's own when chaining). ``eval`` appends entries and returns the last one's logits (the head's guess
    of the next token) and the head's own state there, which a chained step feeds back where the target's
    is not known yet. Subclasses also set ``n_embd``, ``n_vocab`` and ``n_batch``, then call ``_init_batch``."""

    # A head whose graph computes logits for every row of a pass: llama.cpp then copies out the first rows,
    # as many as the batch flags, so a pass that wants the last row's must flag them all.
    _logits_for_every_row = False

    def _init_batch(self) -> None:
        lib = self._lib
        self._batch = lib.llama_batch_init(self.n_batch, self.n_embd, 1)
        # llama_batch_init allocates either tokens or embeddings; the head's graph reads both.
        self._token_buffer = (lib.llama_token * self.n_batch)()
        self._batch.token = self._token_buffer
        self._embd = np.ctypeslib.as_array(self._batch.embd, shape=(self.n_batch, self.n_embd))
        self.tokens: list[int] = []

    def eval(
        self, tokens: Sequence[int], hidden: np.ndarray, *, logits: bool = True
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """Append entries for ``tokens`` (``hidden[i]``: the state row the head reads with ``tokens[i]``);
        with ``logits``, return (the last entry's logits, the head's own state there)."""
        batch = self._batch
        for start in range(0, len(tokens), self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            n_past = len(self.tokens)
            last = len(tokens) - 1 - start  # the one entry with logits, when it is in this chunk
            first_logit = last if logits else len(chunk)
            if self._logits_for_every_row and first_logit < len(chunk):
                first_logit = 0
            fill_batch(batch, chunk, n_past, first_logit)
            self._embd[: len(chunk)] = hidden[start : start + len(chunk)]
            self._decode(batch, n_past)
            self.tokens.extend(chunk)
        if not logits:
            return None
        row = floats_at(self._lib.llama_get_logits_ith(self._ctx.ctx, last), self.n_vocab).copy()
        state = floats_at(llama_cpp_ext().llama_get_embeddings_nextn_ith(self._ctx.ctx, last), self.n_embd)
        return row, state.copy()

    def close(self) -> None:
        if self._batch is not None:
            self._batch.token = ctypes.POINTER(self._lib.llama_token)()  # ours, not llama.cpp's to free
            self._lib.llama_batch_free(self._batch)
            self._batch = None
            self._ctx.close()


class MtpHead(_HeadContext):
    """A model's built-in MTP head (loaded with ``load_mtp``) on a context of its own beside the target's.

    Entry p of the head's KV cache is built from the token at p and the target's last hidden state at
    p - 1 (``Model.hidden``). The head is one attention block, on hybrid targets too.
    """

    def __init__(self, target: Model) -> None:
        if not target.mtp_layers:
            raise LocalspecError(f"{target.path.name} has no MTP head loaded")
        lib = self._lib = target._lib
        params = type(target._context_params).from_buffer_copy(target._context_params)
        params.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
        params.ctx_other = target._ctx.ctx
        params.n_rs_seq = 0
        self.n_embd = target.n_embd_out
        self.n_vocab = target.n_vocab
        self.n_batch = target.n_batch
        self._name = "the MTP head"
        try:
            self._ctx = target._internals.LlamaContext(model=target._model, params=params, verbose=False)
        except ValueError as exc:
            raise LocalspecError(f"llama.cpp could not open the MTP head of {target.path.name}: {exc}") from exc
        # Unmasked: the pinned build's masked copy takes a batch's first rows, not its logits rows.
        llama_cpp_ext().llama_set_embeddings_nextn(self._ctx.ctx, True, False)
        self._init_batch()


def _open_companion(path: Path, target: Model, name: str):
    """(model, context) of a companion head file beside ``target``: its context lends the target's
    embeddings and output projection (``ctx_other``) where the file has none, and it sits on the target's
    devices."""
    lib = target._lib
    model_params = lib.llama_model_default_params()
    model_params.n_gpu_layers = target.n_gpu_layers
    params = type(target._context_params).from_buffer_copy(target._context_params)
    params.ctx_type = lib.LLAMA_CONTEXT_TYPE_DEFAULT
    params.ctx_other = target._ctx.ctx
    params.n_rs_seq = 0
    model = None
    try:
        model = target._internals.LlamaModel(path_model=str(path), params=model_params, verbose=False)
        return model, target._internals.LlamaContext(model=model, params=params, verbose=False)
    except ValueError as exc:
        if model is not None:
            model.close()
        raise LocalspecError(f"llama.cpp could not open {name}: {exc}; run 'localspec check' on the pair") from exc


class Eagle3Head(_HeadContext):
    """An EAGLE-3 head (a companion GGUF) on a context of its own beside the target's.

    Entry e of its KV cache, at position e, is built from the token at context position e + 1 and g at e:
    the head's encoding (``encode``) of the target's layer inputs at e (``Model.features``), as
    llama.cpp's own EAGLE-3 loop lays them out (common/speculative.cpp). The head lends the target's
    embeddings and output projection where its file has none.
    """

    _logits_for_every_row = True  # the pinned src/models/eagle3.cpp selects no output rows

    def __init__(self, path: Path, target: Model, features: int) -> None:
        lib = self._lib = target._lib
        self._name = f"the EAGLE-3 head {Path(path).name}"
        self._model, self._ctx = _open_companion(path, target, self._name)
        self.n_embd = int(self._model.n_embd())
        self.n_vocab = target.n_vocab
        self.n_batch = target.n_batch
        self.n_features = features
        llama_cpp_ext().llama_set_embeddings_nextn(self._ctx.ctx, True, False)  # g, and the chained state
        self._encoder_batch = lib.llama_batch_init(self.n_batch, features, 1)
        self._encoder_embd = np.ctypeslib.as_array(self._encoder_batch.embd, shape=(self.n_batch, features))
        self._init_batch()

    @property
    def n_params(self) -> int:
        return int(self._model.n_params())

    def encode(self, features: np.ndarray) -> np.ndarray:
        """g for each row of the target's ``features`` (positions are placeholders after the last entry:
        llama.cpp checks them against the memory, and the encoder stores nothing)."""
        out = np.empty((len(features), self.n_embd), np.float32)
        batch = self._encoder_batch
        for start in range(0, len(features), self.n_batch):
            chunk = features[start : start + self.n_batch]
            batch.n_tokens = len(chunk)
            for i in range(len(chunk)):
                batch.pos[i] = len(self.tokens) + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            self._encoder_embd[: len(chunk)] = chunk
            code = self._lib.llama_encode(self._ctx.ctx, batch)
            if code != 0:
                raise LocalspecError(f"llama_encode of {self._name} failed with code {code}")
            pointer = llama_cpp_ext().llama_get_embeddings_nextn(self._ctx.ctx)
            out[start : start + len(chunk)] = floats_at(pointer, len(chunk) * self.n_embd).reshape(len(chunk), -1)
        return out

    def close(self) -> None:
        if self._batch is not None:
            self._lib.llama_batch_free(self._encoder_batch)
            super().close()
            self._model.close()


class DFlashHead(_HeadCache):
    """A DFlash head (a companion GGUF) on a context of its own beside the target's.

    Entry p of its KV cache holds the head's keys and values of the target's layer inputs at context
    position p (``inject``: an embeddings pass through its fusion layer, no attention). A draft is one pass
    over a block [the last context token, mask x k] at the positions after the entries, whose rows attend
    to every entry and to the whole block (not causally, unless the file says so); rows 1..k are the k
    draft tokens' logits (``block``), and the block's cells are taken back at once. ``tokens`` mirrors the
    entries: the context token at each position, by which they are judged.
    """

    def __init__(self, path: Path, target: Model, features: int, *, mask_token: int, causal: bool) -> None:
        lib = self._lib = target._lib
        self._name = f"the DFlash head {Path(path).name}"
        self._model, self._ctx = _open_companion(path, target, self._name)
        self.n_vocab = target.n_vocab
        self.n_batch = target.n_batch
        self.mask_token = mask_token
        self.tokens: list[int] = []
        lib.llama_set_causal_attn(self._ctx.ctx, causal)
        self._block = lib.llama_batch_init(self.n_batch, 0, 1)
        self._inject = lib.llama_batch_init(self.n_batch, features, 1)
        self._inject_embd = np.ctypeslib.as_array(self._inject.embd, shape=(self.n_batch, features))
        # An embeddings batch on an M-RoPE head reads 4 position rows per token (section-major), more than
        # llama_batch_init allocates: the rows are ours.
        self._positions = (lib.llama_pos * (4 * self.n_batch))()
        # The address, not the field: a pointer read from a ctypes struct shares the struct's memory, so it
        # would read back our rows once they are set, and llama_batch_free would free Python's buffer.
        self._own_pos = ctypes.cast(self._inject.pos, ctypes.c_void_p).value
        self._inject.pos = self._positions

    @property
    def n_params(self) -> int:
        return int(self._model.n_params())

    def inject(self, tokens: Sequence[int], features: np.ndarray) -> None:
        """Append entries for context ``tokens`` from the target's layer inputs at their positions."""
        batch = self._inject
        for start in range(0, len(tokens), self.n_batch):
            n, n_past = min(self.n_batch, len(tokens) - start), len(self.tokens)
            batch.n_tokens = n
            for i in range(n):
                for row in range(3):  # temporal, height, width: all the text position; the fourth stays 0
                    self._positions[row * n + i] = n_past + i
                self._positions[3 * n + i] = 0
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = False
            self._inject_embd[:n] = features[start : start + n]
            self._decode(batch, n_past)
            self.tokens.extend(tokens[start : start + n])

    def block(self, last: int, k: int) -> np.ndarray:
        """The (k, n_vocab) logits of k draft tokens after the entries and ``last`` (the last context
        token, whose entry the target has not made yet)."""
        n_past = len(self.tokens)
        # The pinned dflash graph computes logits for every row and llama.cpp copies out as many rows as the
        # batch flags, from the first: so all are flagged.
        fill_batch(self._block, [last] + [self.mask_token] * k, n_past, 0)
        try:
            self._decode(self._block, n_past)
            rows = floats_at(self._lib.llama_get_logits(self._ctx.ctx), (k + 1) * self.n_vocab)
            return rows.reshape(k + 1, self.n_vocab)[1:].copy()
        finally:
            self._lib.llama_memory_seq_rm(self._ctx.memory, 0, n_past, -1)

    def close(self) -> None:
        if self._block is not None:
            self._inject.pos = ctypes.cast(self._own_pos, type(self._inject.pos))  # llama_batch_free frees its own
            self._lib.llama_batch_free(self._inject)
            self._lib.llama_batch_free(self._block)
            self._block = None
            self._ctx.close()
            self._model.close()
