"""The acceptance rule on its own: exact distributions checked with chi-square, no model involved."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from localspec.engine.decoding.acceptance import verify_greedy, verify_sampled

# Each chi-square check below has a false-alarm rate of 1e-4; a broken rule gives p-values near 0.
ALPHA = 1e-4
N = 40_000


def _random_dist(rng, n, zeros=0):
    w = rng.random(n) ** 2
    w[rng.choice(n, size=zeros, replace=False)] = 0.0
    return w / w.sum()


def _chi2_pvalue(samples, probs):
    counts = np.bincount(samples, minlength=len(probs))
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token with probability 0"
    return stats.chisquare(counts[support], probs[support] * len(samples)).pvalue


def test_greedy_accepts_matching_prefix_then_target_token():
    assert verify_greedy([5, 6, 7], [5, 6, 9, 1]) == (2, 9)
    assert verify_greedy([5, 6, 7], [5, 6, 7, 1]) == (3, 1)  # all accepted: bonus from the target
    assert verify_greedy([5], [4, 8]) == (0, 4)
    assert verify_greedy([], [3]) == (0, 3)


@pytest.mark.parametrize("point_mass", [False, True], ids=["draft-model", "lookup"])
def test_sampled_first_token_follows_target(point_mass):
    rng = np.random.default_rng(0)
    v = 7
    p = [_random_dist(rng, v, zeros=2), _random_dist(rng, v)]
    q = [_random_dist(rng, v, zeros=1)]
    firsts, seconds = [], []
    for _ in range(N):
        draft = [3] if point_mass else [int(rng.choice(v, p=q[0]))]
        n, token = verify_sampled(draft, None if point_mass else q, p, rng)
        firsts.append(draft[0] if n == 1 else token)
        if n == 1:
            seconds.append(token)
    assert _chi2_pvalue(np.array(firsts), p[0]) > ALPHA
    # After an accepted draft the bonus token is drawn from the target's next distribution.
    assert _chi2_pvalue(np.array(seconds), p[1]) > ALPHA


def test_two_draft_tokens_follow_the_target_jointly():
    rng = np.random.default_rng(1)
    v = 5
    p = [_random_dist(rng, v) for _ in range(3)]
    q = [_random_dist(rng, v, zeros=1) for _ in range(2)]
    # With state-independent rows the emitted pair must be distributed as p0 x p1.
    pairs = []
    for _ in range(N):
        draft = [int(rng.choice(v, p=q[0])), int(rng.choice(v, p=q[1]))]
        n, token = verify_sampled(draft, q, p, rng)
        emitted = draft[:n] + [token]
        if len(emitted) >= 2:
            pairs.append(emitted[0] * v + emitted[1])
        else:
            pairs.append(emitted[0] * v + int(rng.choice(v, p=p[1])))  # the next round would draw from p1
    assert _chi2_pvalue(np.array(pairs), np.outer(p[0], p[1]).ravel()) > ALPHA


def test_identical_p_and_q_accept_everything():
    rng = np.random.default_rng(2)
    p = [_random_dist(rng, 6) for _ in range(4)]
    for _ in range(200):
        draft = [int(rng.choice(6, p=row)) for row in p[:3]]
        assert verify_sampled(draft, p[:3], p, rng)[0] == 3


def test_broken_rule_is_caught():
    """The same check fails for the classic bug of resampling from p instead of the residual."""
    rng = np.random.default_rng(3)
    v = 6
    p = [_random_dist(rng, v), _random_dist(rng, v)]
    q = [_random_dist(rng, v)]
    firsts = []
    for _ in range(N):
        d = int(rng.choice(v, p=q[0]))
        if rng.random() < min(1.0, p[0][d] / q[0][d]):
            firsts.append(d)
        else:
            firsts.append(int(rng.choice(v, p=p[0])))  # wrong: should be normalize(max(p - q, 0))
    assert _chi2_pvalue(np.array(firsts), p[0]) < ALPHA
