"""The llama.cpp wrapper: per-row logits, KV rollback, and batch-invariant numerics."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.engine.backend import LlamaModel
from localspec.errors import ContextFullError


def _single_and_batched(model: LlamaModel, tokens: list[int], split: int, chunk: int | None = None):
    """Logits of tokens[split:] evaluated one by one, and in batches of ``chunk`` (default: one batch)."""
    model.reset()
    model.eval(tokens[:split], n_logits=0)
    single = np.array([model.eval([t])[0] for t in tokens[split:]])
    model.reset()
    model.eval(tokens[:split], n_logits=0)
    rest = tokens[split:]
    chunk = chunk or len(rest)
    batched = np.concatenate([model.eval(rest[i : i + chunk], n_logits=len(rest[i : i + chunk]))
                              for i in range(0, len(rest), chunk)])
    return single, batched


def test_batched_verification_logits_equal_one_by_one_bit_for_bit(tiny_target):
    """Greedy speculative output equals target-alone output only if this holds exactly."""
    model = LlamaModel(tiny_target, n_ctx=256, n_threads=1)
    tokens = model.tokenize("hello world the code print x = hello world the code def return", add_bos=True)
    single, batched = _single_and_batched(model, tokens, 3)
    assert np.array_equal(single, batched)


@pytest.mark.real
@pytest.mark.parametrize("chunk", [2, 12, 21, None])
def test_real_target_is_batch_invariant(qwen_pair, chunk):
    """Batches of 2-24 take the patched small-batch GEMV (one token its one-row GEMV), larger ones the
    tiled kernel: all bit-exact."""
    model = LlamaModel(qwen_pair[0], n_ctx=512, n_threads=2)
    code = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    tokens = model.tokenize(code * 2, add_bos=False)
    single, batched = _single_and_batched(model, tokens, 8, chunk)
    assert len(single) >= 40  # one batch is past the small-batch range (24 rows)
    assert np.array_equal(single, batched)


def test_rollback_then_eval_matches_fresh(tiny_target):
    model = LlamaModel(tiny_target, n_ctx=256, n_threads=1)
    tokens = model.tokenize("the code print x", add_bos=True)
    model.eval(tokens + [5, 6, 7, 8])
    model.rollback(len(tokens) - 1)
    assert model.tokens == tokens[:-1]
    again = model.eval(tokens[-1:])[0]
    fresh = LlamaModel(tiny_target, n_ctx=256, n_threads=1).eval(tokens)[0]
    assert np.array_equal(again, fresh)


def test_eval_returns_the_requested_rows(tiny_target):
    model = LlamaModel(tiny_target, n_ctx=256, n_threads=1)
    tokens = model.tokenize("hello world", add_bos=True)
    rows = model.eval(tokens, n_logits=3)
    assert rows.shape == (3, model.n_vocab)
    assert model.n_past == len(tokens)


def test_context_overflow_is_a_clear_error(tiny_target):
    model = LlamaModel(tiny_target, n_ctx=64, n_threads=1)
    with pytest.raises(ContextFullError, match="context window full"):
        model.eval(list(range(3, 70)))
    assert model.n_past == 0


def test_token_bytes_are_exact(tiny_target):
    model = LlamaModel(tiny_target, vocab_only=True)
    text = "hello world"
    assert b"".join(model.token_bytes(t) for t in model.tokenize(text, add_bos=False)).decode().strip() == text
