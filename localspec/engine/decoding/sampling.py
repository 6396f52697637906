"""Turning logits into the distribution a token is drawn from, and drawing it.

Target and draft go through the same function, so the p and q that rejection sampling compares are
the distributions each model really samples from. Filters run in llama.cpp's default order: top-k,
top-p and min-p on the untempered distribution, then (for editors' fill-in-the-middle requests) llama.cpp's
``infill`` sampler, then temperature.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

DEFAULT_TEMPERATURE = 0.0  # greedy
DEFAULT_TOP_K = 40
DEFAULT_TOP_P = 0.95
DEFAULT_MIN_P = 0.05


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0, top_p 1 and min_p 0 switch those filters off."""

    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    seed: int | None = None
    infill: InfillRule | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The dense (n_vocab,) float64 distribution that ``params`` samples from, given one logits row."""
    n_vocab = logits.shape[-1]
    if 0 < params.top_k < n_vocab:
        ids = np.argpartition(logits, -params.top_k)[-params.top_k :]
    else:
        ids = np.arange(n_vocab)
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    kept = logits[ids].astype(np.float64)
    untempered = _softmax(kept)
    keep = len(ids)
    if params.top_p < 1.0:
        keep = min(keep, int(np.searchsorted(np.cumsum(untempered), params.top_p)) + 1)
    if params.min_p > 0.0:
        # Sorted descending, so the tokens above the threshold are a prefix.
        keep = min(keep, max(1, int(np.count_nonzero(untempered >= params.min_p * untempered[0]))))
    ids, kept = ids[:keep], kept[:keep]
    if params.infill is not None:
        ids, kept = params.infill.apply(ids, logits[ids])
    probs = np.zeros(n_vocab, dtype=np.float64)
    probs[ids] = _softmax(kept.astype(np.float64) / params.temperature)
    return probs


class InfillVocab(Protocol):
    """What the infill sampler reads from the vocabulary (the llama.cpp ``Model`` has it)."""

    end_of_text_id: int

    def is_end_of_generation(self, token: int) -> bool: ...

    def text_piece(self, token: int) -> bytes: ...


class InfillRule:
    """llama.cpp's ``infill`` sampler (``llama_sampler_infill_apply`` in the pinned src/llama-sampler.cpp), which
    llama.vim and llama.vscode put after top-k and top-p. Step for step and in float32 as upstream does it, so
    its thresholds fall the same way: end the completion when end-of-generation tokens carry enough of the
    probability; else merge each token into another whose text it starts (into the likelier one) and keep only
    clear winners (p >= 0.2, then p >= 1/(n+1)); nothing but end-of-generation left: end of text for sure.

    Upstream's probabilities are only its working: the ``dist`` sampler after it draws from the softmax of the
    survivors' logits again, so what this returns is the survivors and their logits, not the merged sums."""

    def __init__(self, vocab: InfillVocab) -> None:
        self._vocab = vocab

    def apply(self, ids: np.ndarray, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The surviving ids and their logits, given candidates sorted by falling logit."""
        vocab = self._vocab
        logits = logits.astype(np.float32)
        p = _softmax32(logits)
        eog = np.array([vocab.is_end_of_generation(int(t)) for t in ids], dtype=bool)
        n = np.float32(len(ids))
        if np.float32(3) * _sum32(p[eog]) * n > _sum32(p[~eog]):
            return ids[eog], logits[eog]
        pieces = [vocab.text_piece(int(t)) for t in ids]
        for i0, i1 in [(i0, i1) for i0, a in enumerate(pieces) for i1, b in enumerate(pieces)
                       if i0 != i1 and a and len(a) <= len(b) and b.startswith(a)]:
            if logits[i0] == -np.inf or logits[i1] == -np.inf:
                continue
            dst, src = (i1, i0) if p[i1] > p[i0] else (i0, i1)
            p[dst] += p[src]
            logits[src], p[src] = -np.inf, 0
        keep = eog | (p >= np.float32(0.2))
        n_text = int(np.count_nonzero(keep & ~eog))
        if n_text == 0:
            return np.array([vocab.end_of_text_id]), np.array([1.0], dtype=np.float32)
        ids, logits, eog, p = ids[keep], logits[keep], eog[keep], p[keep]
        p = p / _sum32(p)
        keep = eog | (p >= np.float32(1.0 / (n_text + 1)))
        return ids[keep], logits[keep]


def _softmax32(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(), dtype=np.float32)
    return e / _sum32(e)


def _sum32(x: np.ndarray) -> np.float32:
    """A float32 sum taken in order, as llama.cpp's loops take it (numpy's pairwise sum rounds otherwise)."""
    return np.cumsum(x, dtype=np.float32)[-1] if len(x) else np.float32(0)


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a (possibly unnormalized) non-negative weight vector."""
    ids = np.flatnonzero(probs)
    cdf = np.cumsum(probs[ids])
    return int(ids[min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(ids) - 1)])


class ProbabilityRows:
    """Rows of ``probabilities`` computed on first use: verification usually stops at the first rejection."""

    def __init__(self, logits: np.ndarray, params: SamplingParams) -> None:
        self._logits = logits
        self._params = params
        self._rows: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._logits)

    def __getitem__(self, i: int) -> np.ndarray:
        if i not in self._rows:
            self._rows[i] = probabilities(self._logits[i], self._params)
        return self._rows[i]
