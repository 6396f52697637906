"""Suffix decoding: draft from earlier answers of the same model, scored by how often each continuation
followed and how it fared when drafted before.

Agents and scripted pipelines repeat themselves across requests (tool-call JSON, SQL over one schema, the
same edit to several files), so the answers of earlier requests predict the current one where the current
context alone (prompt lookup) does not. After SuffixDecoding (arXiv 2411.04975), the index finds the earlier
places where the context's suffix occurred, and drafts the continuation best supported: the draft's
score is the product of its tokens' estimated acceptance, each the mean of a Beta posterior whose prior has
as mean the share of the occurrences agreeing so far that agree on the token too, and counts as
``DEFAULT_PRIOR_WEIGHT`` verifications. The evidence is how the continuation fared when drafted before: the
decoder reports each verification (``record``: accepted and rejected tokens, per stored position drafted
from, kept in memory for the session). Never drafted, the score is the share of occurrences still agreeing;
rejected again and again, a continuation is cut there or gives way to a competing branch; accepted, it
drafts past splits its share alone would stop at. Where occurrences disagree the best-scoring branch is
taken, and the draft stops once its score would fall below ``DEFAULT_MIN_SCORE``. Only what is drafted
changes; verification still decides every token. It drafts the best branch only, not a token tree: in
replays of the agent-repeat slice a runner-up branch verified beside the draft gained next to nothing
(the README has the figures), and a tree would need several sequence ids per verifying pass, which the
exact kernels and the rollback are not written for.

The index is numpy arrays, not a Python suffix tree: 10 million stored tokens take about 180 MB (20 MB of
it the outcomes) and a lookup costs about 0.1 ms (median, ``scripts/bench/suffix_index.py``). Each position is
keyed by a hash of the ``KEY_LEN`` tokens before it; the keys are sorted once, and answers added later go
into a small second table that is folded into the first when it grows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from localspec.engine.drafters.base import MAX_COPY_DRAFT

# Tokens hashed into a key: shorter finds more matches, longer fewer chance ones.
KEY_LEN = 3
# Ends every stored answer, so no key and no draft spans two answers.
SEPARATOR = -1
# The most recent occurrences of a key that are weighed; older ones rarely change the majority.
DEFAULT_MAX_OCCURRENCES = 64
# How far back a match is measured; occurrences matching at least TRUSTED_MATCH tokens (or the longest
# match, if shorter) vote on the continuation, so the counts come from places that look like this one.
MAX_MATCH = 32
TRUSTED_MATCH = 8
DEFAULT_MIN_SCORE = 0.3
# How many verifications the occurrences' share weighs as (the Beta prior's count): one rejection halves
# the score of a continuation every occurrence shares, three cut it below DEFAULT_MIN_SCORE.
DEFAULT_PRIOR_WEIGHT = 1.0
# The recent table is folded into the sorted one once it holds this share of the tokens.
MERGE_SHARE = 0.125
MIN_MERGE_TOKENS = 1 << 16
_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class SuffixDraft:
    """A draft from the index: ``tokens``; ``match_len``, how many context tokens the occurrences it
    continues matched (up to ``MAX_MATCH``); ``sources``, the stored position each token is drafted from
    (for ``SuffixIndex.record``); ``runner_up``, at the first place the occurrences disagreed, (the draft
    position there, the stored position the next-best branch continues from), or None (what a token tree
    would verify beside the draft: ``scripts/replay/suffix.py`` measures it). Empty when the context's
    last ``KEY_LEN`` tokens never occurred."""

    tokens: list[int]
    match_len: int
    sources: list[int]
    runner_up: tuple[int, int] | None = None


def _outcome_factor(accepted, rejected, share, weight: float):
    """What a continuation's verification outcomes multiply its share by: the mean of its acceptance's Beta
    posterior, whose prior has the share as mean and ``weight`` as count, over the share (exactly 1 when
    unverified: w*s / (s*w))."""
    return (accepted + weight * share) / (share * (accepted + rejected + weight))


def _keys(tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The hash of the KEY_LEN tokens before each position (which must be at least KEY_LEN)."""
    key = np.zeros(len(positions), dtype=np.uint64)
    for back in range(KEY_LEN, 0, -1):
        key = key * _MULTIPLIER + (tokens[positions - back].astype(np.int64) + 2).astype(np.uint64)
    return key


class _Table:
    """Positions sorted by the key of the tokens before them (ties by position, oldest first)."""

    def __init__(self, tokens: np.ndarray, start: int, stop: int) -> None:
        positions = np.arange(max(start, KEY_LEN), stop, dtype=np.int64)
        # A key must lie inside one answer, and a separator is never a continuation.
        ok = tokens[positions] != SEPARATOR
        for back in range(1, KEY_LEN + 1):
            ok &= tokens[positions - back] != SEPARATOR
        positions = positions[ok]
        keys = _keys(tokens, positions)
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.positions = positions[order].astype(np.int32)

    def occurrences(self, key: np.uint64, limit: int) -> np.ndarray:
        lo = int(np.searchsorted(self.keys, key, side="left"))
        hi = int(np.searchsorted(self.keys, key, side="right"))
        return self.positions[max(lo, hi - limit) : hi]


class SuffixIndex:
    """Earlier answers, searchable by the context's suffix.

    Args:
        tokens: the stored answers, each ending with ``SEPARATOR``.
        max_occurrences, min_score, prior_weight, max_draft: see the module constants.
    """

    def __init__(
        self,
        tokens: Sequence[int] | np.ndarray = (),
        *,
        max_occurrences: int = DEFAULT_MAX_OCCURRENCES,
        min_score: float = DEFAULT_MIN_SCORE,
        prior_weight: float = DEFAULT_PRIOR_WEIGHT,
        max_draft: int = MAX_COPY_DRAFT,
    ) -> None:
        if not 0.0 < min_score <= 1.0:
            raise ValueError(f"min_score must be in (0, 1], got {min_score}")
        if prior_weight <= 0.0:
            raise ValueError(f"prior_weight must be positive, got {prior_weight}")
        self.max_occurrences = max_occurrences
        self.min_score = min_score
        self.prior_weight = prior_weight
        self.max_draft = max_draft
        self._tokens = np.asarray(tokens, dtype=np.int32)
        self._size = len(self._tokens)
        self._sorted = _Table(self._tokens, 0, self._size)
        self._recent = _Table(self._tokens, self._size, self._size)
        self._recent_start = self._size
        # Verification outcomes per stored position drafted from, [accepted, rejected], a byte each that
        # saturates (past a few, more of one outcome hardly moves a score): 2 bytes a token beside the 16 of
        # the tokens, keys and positions, and one gather per lookup (sorted arrays of only the drafted
        # positions cost more in np.insert per round than this costs in memory).
        self._outcomes = np.zeros((len(self._tokens), 2), dtype=np.uint8)
        self._any_outcome = False

    def __len__(self) -> int:
        return self._size

    @property
    def tokens(self) -> np.ndarray:
        """The stored answers, each ending with SEPARATOR (a view; do not modify)."""
        return self._tokens[: self._size]

    def add(self, answer: Sequence[int]) -> None:
        """Store one answer (its lead-in from the prompt first, so the answer's opening can be drafted)."""
        if not answer:
            return
        new = np.asarray([*answer, SEPARATOR], dtype=np.int32)
        end = self._size + len(new)
        if end > len(self._tokens):
            grown = np.empty(max(end, 2 * len(self._tokens)), dtype=np.int32)
            grown[: self._size] = self._tokens[: self._size]
            self._tokens = grown
            outcomes = np.zeros((len(grown), 2), dtype=np.uint8)
            outcomes[: self._size] = self._outcomes[: self._size]
            self._outcomes = outcomes
        self._tokens[self._size : end] = new
        self._size = end
        if end - self._recent_start > max(MIN_MERGE_TOKENS, MERGE_SHARE * end):
            self._sorted = _Table(self._tokens, 0, end)
            self._recent_start = end
        self._recent = _Table(self._tokens, self._recent_start, end)

    def propose(self, context: Sequence[int], max_tokens: int) -> SuffixDraft:
        """Draft up to ``max_tokens`` tokens continuing ``context`` from the stored answers."""
        count = min(max_tokens, self.max_draft)
        tail = np.asarray(context[-MAX_MATCH:], dtype=np.int64)
        if count <= 0 or len(tail) < KEY_LEN or self._size == 0:
            return SuffixDraft([], 0, [])
        key = _keys(tail, np.array([len(tail)]))[0]
        limit = self.max_occurrences
        found = np.concatenate((self._sorted.occurrences(key, limit), self._recent.occurrences(key, limit)))
        if len(found) == 0:
            return SuffixDraft([], 0, [])
        tokens = self._tokens
        found = found[-limit:].astype(np.int64)
        # How far back each occurrence matches the context (a hash collision matches less than KEY_LEN).
        back = found[:, None] - 1 - np.arange(len(tail))
        before = np.where(back >= 0, tokens[np.maximum(back, 0)], SEPARATOR)
        same = before == tail[::-1]
        match = np.where(same.all(axis=1), len(tail), same.argmin(axis=1))
        longest = int(match.max())
        if longest < KEY_LEN:
            return SuffixDraft([], 0, [])
        voters = found[match >= min(longest, TRUSTED_MATCH)]
        tokens, sources, runner_up = self._follow(voters, count)
        return SuffixDraft(tokens, longest, sources, runner_up)

    def record(self, sources: Sequence[int], accepted: int) -> None:
        """Remember how a draft fared: of the tokens drafted from ``sources`` (a ``SuffixDraft``'s, in order),
        the first ``accepted`` were accepted and the next one, if any, rejected (later ones were not verified)."""
        verified = np.asarray(sources[: accepted + 1], dtype=np.int64)
        rejected = (np.arange(len(verified)) >= accepted).astype(np.int64)  # the column: 0 accepted, 1 rejected
        counts = self._outcomes[verified, rejected]
        self._outcomes[verified, rejected] = np.minimum(counts, 254) + 1
        self._any_outcome |= len(verified) > 0

    def _outcomes_at(self, positions: np.ndarray) -> np.ndarray:
        """[accepted, rejected] at each of ``positions`` (a trailing axis of 2)."""
        if not self._any_outcome:
            return np.zeros((*positions.shape, 2), dtype=np.uint8)
        # Past the end: the last separator's, never drafted from.
        return self._outcomes[np.minimum(positions, self._size - 1)]

    def _follow(self, starts: np.ndarray, count: int) -> tuple[list[int], list[int], tuple[int, int] | None]:
        """The continuation ``starts`` best support and the stored positions it is drafted from, cut where its
        score (the share of occurrences still agreeing, times their outcome factors) drops below min_score;
        and the runner-up branch at the first split (see ``SuffixDraft``)."""
        ahead = starts[:, None] + np.arange(count)
        rows = np.where(ahead < self._size, self._tokens[np.minimum(ahead, self._size - 1)], SEPARATOR)
        if len(rows) > 1:
            # Sorted as byte strings, so rows sharing a prefix are adjacent (8x faster than np.lexsort).
            keys = np.ascontiguousarray(rows, dtype=">i4").view(np.dtype((np.void, 4 * count))).ravel()
            order = np.argsort(keys)
            rows, starts = rows[order], starts[order]
        outcomes = self._outcomes_at(starts[:, None] + np.arange(count))
        verified = outcomes.max(axis=0).any(axis=1)  # per column: whether any token there was verified before
        weight = self.prior_weight
        lo, hi, total = 0, len(rows), len(rows)
        boost = 1.0  # the product of the outcome factors so far: the score is (hi - lo) / total * boost
        draft: list[int] = []
        sources: list[int] = []
        runner_up = None
        j = 0
        while j < count:
            column = rows[lo:hi, j]
            first = j  # the first column whose outcomes are still to be weighed
            if column[0] != column[-1]:
                # The rows agree up to column j, so each continuation is a run of this column.
                bounds = [0, *(np.flatnonzero(column[1:] != column[:-1]) + 1).tolist(), len(column)]
                sizes = [b - a for a, b in zip(bounds, bounds[1:])]
                factors = [1.0] * len(sizes)
                if verified[j]:
                    accepted, rejected = np.add.reduceat(outcomes[lo:hi, j], bounds[:-1], dtype=np.int64).T
                    factors = _outcome_factor(accepted, rejected, np.divide(sizes, hi - lo), weight).tolist()
                # ties: the first run in sorted order, deterministically
                ranked = sorted(range(len(sizes)), key=lambda i: sizes[i] * factors[i], reverse=True)
                best = ranked[0]
                if runner_up is None:
                    second = slice(lo + bounds[ranked[1]], lo + bounds[ranked[1] + 1])
                    runner_up = (j, int(starts[second].max()) + j)
                lo, hi = lo + bounds[best], lo + bounds[best + 1]
                boost *= factors[best]
                if (hi - lo) * boost < self.min_score * total:
                    break  # the score would fall below min_score
                first = j + 1
            # Rows lo..hi agree on column j; sorted, they agree up to where their first and last differ.
            differs = np.flatnonzero(rows[lo, j:] != rows[hi - 1, j:])
            end = j + int(differs[0]) if len(differs) else count
            separator = np.flatnonzero(rows[lo, j:end] == SEPARATOR)
            cut = len(separator) > 0
            if cut:
                end = j + int(separator[0])
            if verified[first:end].any():
                # All rows agree on these columns (a share of 1), so only outcomes can lower the score.
                accepted, rejected = outcomes[lo:hi, first:end].sum(axis=0, dtype=np.int64).T
                scores = boost * np.cumprod(_outcome_factor(accepted, rejected, 1.0, weight))
                low = np.flatnonzero((hi - lo) * scores < self.min_score * total)
                if len(low):
                    end, cut = first + int(low[0]), True
                else:
                    boost = float(scores[-1])
            draft += rows[lo, j:end].tolist()
            newest = int(starts[lo:hi].max())  # the occurrence drafted from: the last to leave the voters
            sources += range(newest + j, newest + end)
            if cut:
                break
            j = end
        return draft, sources, runner_up
