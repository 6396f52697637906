"""The ``infill`` sampler (llama.vim's and llama.vscode's chain: top-k, top-p, infill) against llama.cpp's own:
the same logits give the same tokens, with the probabilities llama.cpp's final draw gives them."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest

from localspec.engine.decoding.sampling import InfillRule, SamplingParams, probabilities
from localspec.engine.llama.model import Model


def llama_cpp_distribution(vocab: Model, logits: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """What llama-server samples from with ``samplers: [top_k, top_p, infill]``: its chain applied by llama.cpp,
    then the softmax of the survivors' logits that its final ``dist`` sampler draws from."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for sampler in (llama_cpp.llama_sampler_init_top_k(top_k), llama_cpp.llama_sampler_init_top_p(top_p, 0),
                    llama_cpp.llama_sampler_init_infill(vocab.vocab_handle)):
        llama_cpp.llama_sampler_chain_add(chain, sampler)
    n = len(logits)
    data = (llama_cpp.llama_token_data * n)(*(llama_cpp.llama_token_data(i, float(x), 0.0) for i, x in enumerate(logits)))
    candidates = llama_cpp.llama_token_data_array(data, n, -1, False)
    llama_cpp.llama_sampler_apply(chain, ctypes.byref(candidates))
    llama_cpp.llama_sampler_free(chain)
    ids = np.array([data[i].id for i in range(candidates.size)])
    kept = np.array([data[i].logit for i in range(candidates.size)], dtype=np.float64)
    weights = np.exp(kept - kept.max())
    probs = np.zeros(n)
    probs[ids] = weights / weights.sum()
    return probs


def rows(vocab: Model, n: int, seed: int) -> list[np.ndarray]:
    """Logit rows that reach every branch: random at many sharpnesses, end-of-generation made likely, and a
    token tied with one its text starts with."""
    rng = np.random.default_rng(seed)
    out = [(rng.standard_normal(vocab.n_vocab) * rng.uniform(0.5, 12)).astype(np.float32) for _ in range(n)]
    for boost in (2.0, 6.0, 12.0):
        row = (rng.standard_normal(vocab.n_vocab) * 3).astype(np.float32)
        row[vocab.eos_id] = row.max() + boost - 6
        out.append(row)
    return out


def prefix_pair(vocab: Model) -> tuple[int, int]:
    """Two text tokens, the first's text a prefix of the second's."""
    pieces = {t: vocab.text_piece(t) for t in range(vocab.n_vocab)}
    return next((a, b) for a in pieces for b in pieces
                if a != b and pieces[a] and len(pieces[a]) < len(pieces[b]) and pieces[b].startswith(pieces[a]))


def check_against_llama_cpp(vocab: Model, logit_rows: list[np.ndarray], top_k: int, top_p: float) -> dict[str, int]:
    """Every row gives llama.cpp's distribution; returns how often each branch of the sampler was taken."""
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=0.0, infill=InfillRule(vocab))
    branches = {"end": 0, "end of text for sure": 0, "text": 0}
    for row in logit_rows:
        ours = probabilities(row, params)
        theirs = llama_cpp_distribution(vocab, row, top_k, top_p)
        assert np.array_equal(np.flatnonzero(ours), np.flatnonzero(theirs))
        np.testing.assert_allclose(ours, theirs, atol=1e-6)
        support = np.flatnonzero(ours)
        if list(support) == [vocab.end_of_text_id] and row[vocab.end_of_text_id] < row.max():
            branches["end of text for sure"] += 1
        elif all(vocab.is_end_of_generation(int(t)) for t in support):
            branches["end"] += 1
        else:
            branches["text"] += 1
    return branches


def test_the_infill_sampler_keeps_what_llama_cpp_keeps(tiny_target):
    vocab = Model(tiny_target, vocab_only=True)
    branches = check_against_llama_cpp(vocab, rows(vocab, 300, seed=0), top_k=40, top_p=0.9)
    assert all(branches.values()), branches  # every branch was compared, not only the common one


def test_a_token_merges_into_one_that_its_text_starts(tiny_target):
    vocab = Model(tiny_target, vocab_only=True)
    short, long = prefix_pair(vocab)
    other = next(t for t in range(vocab.n_vocab) if t not in (short, long) and vocab.text_piece(t)
                 and not vocab.text_piece(t).startswith(vocab.text_piece(short)))
    row = np.full(vocab.n_vocab, -30.0, dtype=np.float32)
    row[[short, long, other]] = np.log([0.18, 0.18, 0.64])
    params = SamplingParams(temperature=1.0, top_k=40, top_p=0.99, min_p=0.0, infill=InfillRule(vocab))
    # Apart, both fall under the 0.2 threshold; merged, one of them holds 0.36 and stays beside the third.
    assert len(np.flatnonzero(probabilities(row, params))) == 2
    check_against_llama_cpp(vocab, [row], top_k=40, top_p=0.99)


@pytest.mark.real
def test_the_infill_sampler_keeps_what_llama_cpp_keeps_on_qwen(qwen_pair):
    """Qwen's vocabulary: byte-level pieces, several end-of-generation tokens, EOT distinct from EOS."""
    vocab = Model(qwen_pair[0], vocab_only=True)
    check_against_llama_cpp(vocab, rows(vocab, 40, seed=1), top_k=40, top_p=0.99)
