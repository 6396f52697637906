"""Turning logits into the distribution a token is drawn from, and drawing it.

Target and draft go through the same function, so the p and q that rejection sampling compares are
the distributions each model really samples from. Filters run in llama.cpp's default order: top-k,
top-p and min-p on the untempered distribution, then temperature.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    probs = np.zeros(n_vocab, dtype=np.float64)
    probs[ids[:keep]] = _softmax(kept[:keep] / params.temperature)
    return probs


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
