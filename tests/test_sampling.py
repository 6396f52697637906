"""The distribution a token is drawn from, and the drawing: pure, no model involved."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from localspec.engine.decoding.sampling import ProbabilityRows, SamplingParams, probabilities, sample

LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.06, 0.04], dtype=np.float32))
OFF = dict(top_k=0, top_p=1.0, min_p=0.0)


def test_temperature_one_without_filters_is_the_softmax():
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, **OFF))
    assert p == pytest.approx([0.5, 0.25, 0.15, 0.06, 0.04], abs=1e-6)


def test_temperature_sharpens_and_flattens():
    cold = probabilities(LOGITS, SamplingParams(temperature=0.5, **OFF))
    hot = probabilities(LOGITS, SamplingParams(temperature=2.0, **OFF))
    assert cold[0] > 0.5 > hot[0] and cold.sum() == pytest.approx(1) and hot.sum() == pytest.approx(1)
    # Temperature t: p_i proportional to p_i^(1/t).
    assert cold == pytest.approx(np.array([0.5, 0.25, 0.15, 0.06, 0.04]) ** 2 / (np.array([0.5, 0.25, 0.15, 0.06, 0.04]) ** 2).sum())


@pytest.mark.parametrize(
    "params,kept",
    [
        (dict(top_k=2, top_p=1.0, min_p=0.0), [0, 1]),
        (dict(top_k=0, top_p=0.8, min_p=0.0), [0, 1, 2]),  # 0.5 + 0.25 < 0.8 <= 0.9
        (dict(top_k=0, top_p=1.0, min_p=0.1), [0, 1, 2, 3]),  # at least a tenth of the top token's 0.5
        (dict(top_k=4, top_p=0.7, min_p=0.0), [0, 1]),
    ],
)
def test_filters_keep_what_llama_cpp_keeps_and_renormalize(params, kept):
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, **params))
    assert list(np.flatnonzero(p)) == kept
    base = np.array([0.5, 0.25, 0.15, 0.06, 0.04])[kept]
    assert p[kept] == pytest.approx(base / base.sum(), abs=1e-6)


def test_filters_see_the_untempered_distribution():
    """min_p and top_p are judged before temperature: a high temperature does not let more tokens in."""
    params = dict(top_k=0, top_p=1.0, min_p=0.2)
    assert list(np.flatnonzero(probabilities(LOGITS, SamplingParams(temperature=1.0, **params)))) == [0, 1, 2]
    assert list(np.flatnonzero(probabilities(LOGITS, SamplingParams(temperature=5.0, **params)))) == [0, 1, 2]


def test_greedy_is_temperature_zero():
    assert SamplingParams().greedy and SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=0.1).greedy


def test_sample_draws_by_weight_even_unnormalized():
    rng = np.random.default_rng(7)
    weights = np.array([0.0, 3.0, 1.0, 0.0, 6.0])  # sums to 10, zeros never drawn
    draws = np.bincount([sample(weights, rng) for _ in range(20000)], minlength=5)
    assert draws[0] == draws[3] == 0
    assert stats.chisquare(draws[[1, 2, 4]], 20000 * np.array([0.3, 0.1, 0.6])).pvalue > 1e-3


def test_probability_rows_are_computed_on_first_use_only():
    logits = np.stack([LOGITS, LOGITS[::-1]])
    rows = ProbabilityRows(logits, SamplingParams(temperature=1.0, **OFF))
    assert len(rows) == 2 and rows._rows == {}
    assert rows[1] == pytest.approx(probabilities(LOGITS[::-1], SamplingParams(temperature=1.0, **OFF)))
    assert set(rows._rows) == {1}
