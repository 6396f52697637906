"""The answer history behind suffix decoding: earlier answers of one tokenizer, kept on disk across sessions.

One file per tokenizer under ``$LOCALSPEC_HOME/history/``: a header (magic, token count, CRC-32 of the
tokens) then the tokens as little-endian int32, each answer ending with ``SEPARATOR``. It holds the user's
answers, so the directory is 0700 and the file 0600. Every save rewrites the file through a temporary file
and a rename, so a crash never leaves half of one; a file that fails its checks (damaged, truncated,
another version) is read as empty and replaced by the next save. Past ``max_tokens`` the oldest answers
are dropped.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from localspec.engine.drafters.suffix_index import SEPARATOR, SuffixIndex
from localspec.engine.llama.model import Model
from localspec.paths import temp_beside

# A million tokens (thousands of answers): a file of 4 MB, about 17 MB in memory, read and indexed in
# about 0.25 s when a session opens.
DEFAULT_MAX_TOKENS = 1_000_000
# Prompt tokens stored before each answer (the chat template's "assistant" header, usually), so the
# opening of an answer can be drafted too.
LEAD_TOKENS = 4
_MAGIC = b"LSHIST1\n"
_HEADER = struct.Struct("<8sQI")
_PRIVATE_DIR = 0o700


def tokenizer_identity(model: Model) -> str:
    """A name for a model's tokenizer: models that share it share a history (a target and its draft, say).

    It digests the tokenizer's kind, the vocabulary size and every 64th token's bytes plus the last 512
    (where special tokens live), not all of them: a lookup is verified, so two vocabularies that differ
    elsewhere sharing a history could only cost rejected drafts, never a changed token.
    """
    digest = hashlib.sha256()
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre"):
        digest.update(f"{key}={model.metadata.get(key)}\x00".encode())
    digest.update(f"{model.n_vocab}\x00".encode())
    for token in sorted({*range(0, model.n_vocab, 64), *range(max(0, model.n_vocab - 512), model.n_vocab)}):
        digest.update(model.token_bytes(token) + b"\x00")
    return digest.hexdigest()[:16]


class HistoryStore:
    """Earlier answers in a ``SuffixIndex``, written to ``path`` by ``save`` (never when None).

    Args:
        path: the history file, or None for a store in memory only (the benchmark's).
        max_tokens: the most tokens kept; the oldest answers are dropped beyond it.
    """

    def __init__(self, path: Path | None, *, max_tokens: int = DEFAULT_MAX_TOKENS) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {max_tokens}")
        self.path = path
        self.max_tokens = max_tokens
        # The benchmark turns it off while it repeats a request: no answers and no draft outcomes are learnt.
        self.learning = True
        self._unsaved = False  # answers added since the file was last written
        self.index = SuffixIndex(np.zeros(0, np.int32) if path is None else _newest(read_tokens(path), max_tokens))

    def __len__(self) -> int:
        return len(self.index)

    def add(self, lead: Sequence[int], answer: Sequence[int]) -> None:
        """Remember an answer (after the last ``LEAD_TOKENS`` of its prompt); ``save`` writes it."""
        if not answer or not self.learning:
            return
        self.index.add([*lead[-LEAD_TOKENS:], *answer])
        self._unsaved = True
        if len(self.index) > self.max_tokens:
            # Down to 7/8 of the bound, so the rebuild this costs is not repeated with every answer.
            self.index = SuffixIndex(_newest(self.index.tokens, self.max_tokens * 7 // 8))

    def record(self, sources: Sequence[int], accepted: int) -> None:
        """Remember how a suffix draft fared (see ``SuffixIndex.record``): in memory only, until the session ends
        or the oldest answers are dropped (the index is then rebuilt without outcomes)."""
        if self.learning:
            self.index.record(sources, accepted)

    def save(self) -> None:
        """Write the history if answers were added since it was last written; a failed write is skipped
        (the history only speeds things up)."""
        if self.path is None or not self._unsaved:
            return
        self._unsaved = False
        body = self.index.tokens.astype("<i4").tobytes()
        try:
            self.path.parent.mkdir(mode=_PRIVATE_DIR, parents=True, exist_ok=True)
            os.chmod(self.path.parent, _PRIVATE_DIR)
            with temp_beside(self.path) as (tmp, out):  # mkstemp creates it 0600
                out.write(_HEADER.pack(_MAGIC, len(body) // 4, zlib.crc32(body)))
                out.write(body)
                out.close()
                os.replace(tmp, self.path)
        except OSError:
            pass


def read_tokens(path: Path) -> np.ndarray:
    """The tokens of a history file; empty when it is missing or fails any check (it is then rewritten)."""
    empty = np.zeros(0, dtype=np.int32)
    try:
        data = path.read_bytes()
    except OSError:
        return empty
    if len(data) < _HEADER.size:
        return empty
    magic, count, crc = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    if magic != _MAGIC or len(body) != 4 * count or zlib.crc32(body) != crc:
        return empty
    tokens = np.frombuffer(body, dtype="<i4").astype(np.int32)
    if count and (tokens[-1] != SEPARATOR or tokens.min() < SEPARATOR):
        return empty
    return tokens


def clear(directory: Path) -> int:
    """Delete every history file in ``directory`` (and any temporary file a crash left); returns how many."""
    removed = 0
    for path in directory.glob("*.bin"):
        path.unlink(missing_ok=True)
        removed += 1
    for path in directory.glob(".*.part"):
        path.unlink(missing_ok=True)
    return removed


def _newest(tokens: np.ndarray, max_tokens: int) -> np.ndarray:
    """The most recent whole answers that fit in ``max_tokens``."""
    if len(tokens) <= max_tokens:
        return tokens
    ends = np.flatnonzero(tokens == SEPARATOR)
    first = np.searchsorted(ends, len(tokens) - max_tokens - 1)  # the first answer end to drop through
    return tokens[ends[first] + 1 :] if first < len(ends) else tokens[:0]
