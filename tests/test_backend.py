"""The llama.cpp wrapper: per-row logits, KV rollback, and batch-invariant numerics."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from localspec.engine.backend import LlamaModel
from localspec.engine.kernels import EXACT, MAX_VERIFY_BATCH, build_verify_cap, choose_kernels, exact_kernels_built
from localspec.errors import ContextFullError


def _keep_prefix(model: LlamaModel, prefix: list[int]) -> None:
    """Leave exactly ``prefix`` in the KV cache, reusing what is there (one prefill serves many cases)."""
    model.rollback(model.common_prefix(prefix))
    if model.n_past < len(prefix):
        model.eval(prefix[model.n_past :], n_logits=0)


def _single_and_batched(model: LlamaModel, tokens: list[int], split: int, chunk: int | None = None):
    """Logits of tokens[split:] evaluated one by one, and in batches of ``chunk`` (default: one batch)."""
    _keep_prefix(model, tokens[:split])
    single = np.array([model.eval([t])[0] for t in tokens[split:]])
    _keep_prefix(model, tokens[:split])
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


@pytest.fixture(scope="module")
def real_target(qwen_pair):
    return LlamaModel(qwen_pair[0], n_ctx=1024, n_threads=2)


# Each side of every kernel switch: repacked q4_K takes a gemv that reads each weight block once for up to
# 3 rows, and with AVX-512 VNNI the tiled kernel from 32 rows (2-9, 31, 33), elsewhere the gemm's 4- and
# 16-row blocks with the gemv for the rows left (2-9, 15-17, 19); q6_K the small-batch GEMV up to 24 rows
# and the tiled kernel beyond (24, 25); a verification is as long as the longest lookup draft plus one (65)
# and never longer than MAX_VERIFY_BATCH, the largest batch flash attention keeps on its per-row exact path.
@pytest.mark.real
@pytest.mark.parametrize("chunk", [2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 19, 24, 25, 31, 33, 65, MAX_VERIFY_BATCH])
def test_real_target_is_batch_invariant(real_target, chunk):
    """Verified logits equal one-token logits bit for bit, with the kernels in use (repacked weights, flash
    attention), after a prefix of 520 tokens (past the 512-entry KV length where stock llama.cpp splits a
    one-token attention across threads)."""
    model = real_target
    assert model.kernels == EXACT
    code = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    tokens = model.tokenize(code * 30, add_bos=False)[: 520 + chunk]
    single, batched = _single_and_batched(model, tokens, 520, chunk)
    assert len(single) == chunk
    assert np.array_equal(single, batched)


# A prompt prefill takes the tiled kernel over repacked q4_K: past MAX_VERIFY_BATCH rows, or from 32 rows when
# the engine flags it (prefill=True).
@pytest.mark.real
@pytest.mark.parametrize(("size", "prefill"), [(MAX_VERIFY_BATCH + 100, False), (64, True)])
def test_real_prefill_reads_repacked_weights_as_plain_ones(real_target, qwen_pair, monkeypatch, size, prefill):
    """Loaded without repacking, the same kernel reads plain q4_K rows. A misread weight, scale or min would
    move the logits: they must agree bit for bit."""
    if not exact_kernels_built():
        pytest.skip("the repacked-prefill kernel comes with scripts/patches/llama-cpp-exact.patch")
    from llama_cpp import _internals

    class PlainWeights(_internals.LlamaModel):  # the extra (repack) buffer types off, as llama.cpp's --no-repack
        def __init__(self, *, params, **kwargs):
            params.use_extra_bufts = False
            super().__init__(params=params, **kwargs)

    monkeypatch.setattr(_internals, "LlamaModel", PlainWeights)
    plain = LlamaModel(qwen_pair[0], n_ctx=1024, n_threads=2)
    code = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    tokens = plain.tokenize(code * 30, add_bos=False)[:size]
    real_target.reset()
    repacked = real_target.eval(tokens, n_logits=len(tokens), prefill=prefill)
    try:
        assert np.array_equal(repacked, plain.eval(tokens, n_logits=len(tokens), prefill=prefill))
    finally:
        plain.close()


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the exact kernels are x86 code")
def test_build_has_the_exact_kernels_where_the_cpu_can_run_them():
    """scripts/setup builds them on every x86 CPU with AVX2 (their repacked-gemm part); losing the patch
    would silently fall back to stock, inexact kernels."""
    cpu_flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "avx2" not in cpu_flags:
        pytest.skip("no AVX2: llama.cpp has no repacked q4_K kernels here")
    assert exact_kernels_built(), "llama.cpp was built without scripts/patches/llama-cpp-exact.patch: rerun scripts/setup"
    assert choose_kernels(exact=None, gpu_layers=0) == EXACT
    if "avx512_vnni" in cpu_flags:
        import llama_cpp

        assert b"AVX512_VNNI = 1" in llama_cpp.llama_print_system_info()  # the small-batch q6_K GEMV


def test_the_builds_verification_cap_is_the_engines():
    """A patched build that says how large a batch it keeps exact must say MAX_VERIFY_BATCH (older patches
    say nothing); exact mode is refused otherwise, so drafts never outgrow the exact kernels."""
    assert build_verify_cap() in (None, MAX_VERIFY_BATCH)
    if build_verify_cap() is not None:
        assert exact_kernels_built()


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


def test_another_context_shares_the_weights_and_keeps_its_own_cache(tiny_target):
    model = LlamaModel(tiny_target, n_ctx=256, n_threads=1)
    other = model.another_context()
    tokens = model.tokenize("the code print x", add_bos=True)
    first = model.eval(tokens)[0]
    assert other.n_past == 0  # nothing of the first context's cache shows in the second
    other.eval(tokens[:2])
    assert model.tokens == tokens and other.tokens == tokens[:2]
    assert np.array_equal(other.eval(tokens[2:])[0], first)
    other.close()  # closes its own context only: the weights stay usable
    model.rollback(len(tokens) - 1)
    assert np.array_equal(model.eval(tokens[-1:])[0], first)
