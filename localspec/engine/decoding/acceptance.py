"""The acceptance rule of speculative decoding, as pure functions over arrays (no model involved).

Greedy: accept the longest draft prefix that equals the target's argmax, then emit the target's token.
Sampling (Leviathan et al. 2023): accept draft token x with probability min(1, p(x) / q(x)); on the first
rejection draw from normalize(max(p - q, 0)); if every draft token is accepted, the bonus token is drawn
from the TARGET's next distribution. This makes the output distributed exactly as target-alone sampling.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localspec.engine.decoding.sampling import sample


def verify_greedy(draft: Sequence[int], target_argmax: Sequence[int]) -> tuple[int, int]:
    """Return (number of draft tokens accepted, the target's next token).

    ``target_argmax[i]`` is the target's greedy choice after the context plus ``draft[:i]``;
    it has len(draft) + 1 entries.
    """
    n = 0
    while n < len(draft) and draft[n] == target_argmax[n]:
        n += 1
    return n, int(target_argmax[n])


def verify_sampled(
    draft: Sequence[int],
    q: Sequence[np.ndarray] | None,
    p: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Return (number of draft tokens accepted, the next token drawn so the output follows p exactly).

    Args:
        draft: the proposed tokens.
        q: the draft's distribution at each draft position, or None for a deterministic proposer
            (prompt lookup), whose q is a point mass on the proposed token.
        p: the target's distribution at each draft position plus one (len(draft) + 1 rows).
        rng: the generation's random stream.
    """
    for i, token in enumerate(draft):
        q_token = 1.0 if q is None else q[i][token]
        if q_token > 0.0 and rng.random() * q_token < p[i][token]:
            continue  # accepted with probability min(1, p/q)
        if q is None:
            residual = p[i].copy()
            residual[token] = 0.0  # max(p - onehot, 0): p(token) <= 1
        else:
            residual = np.maximum(p[i] - q[i], 0.0)
        if not residual.any():
            # Only reachable through rounding when p == q (then rejection has probability 0).
            residual = p[i]
        return i, sample(residual, rng)
    return len(draft), sample(p[len(draft)], rng)
