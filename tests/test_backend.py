"""The llama.cpp wrapper: per-row logits, KV rollback, and batch-invariant numerics."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from localspec.engine.llama.kernels import (
    EXACT,
    MAX_VERIFY_BATCH,
    build_verify_cap,
    choose_kernels,
    exact_kernels_built,
)
from localspec.engine.llama.model import Model
from localspec.errors import ContextFullError
from tests.tiny_models import TinySpec, quantize_tiny_model, write_tiny_model


def _keep_prefix(model: Model, prefix: list[int]) -> None:
    """Leave exactly ``prefix`` in the KV cache, reusing what is there (one prefill serves many cases)."""
    model.rollback(model.common_prefix(prefix))
    if model.n_past < len(prefix):
        model.eval(prefix[model.n_past :], n_logits=0)


def _single_and_batched(model: Model, tokens: list[int], split: int, chunk: int | None = None):
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
    model = Model(tiny_target, n_ctx=256, n_threads=1)
    tokens = model.tokenize("hello world the code print x = hello world the code def return", add_bos=True)
    single, batched = _single_and_batched(model, tokens, 3)
    assert np.array_equal(single, batched)


@pytest.fixture(scope="module")
def real_target(qwen_pair):
    return Model(qwen_pair[0], n_ctx=1024, n_threads=2)


# Tiny models with the real pair's weight types, quantized by llama.cpp (256-wide rows, as K-quants need):
# Q4_K_M mixes repacked q4_K with q6_K (the output, half the attn_v and ffn_down), Q6_K is q6_K throughout.
# Grouped-query attention as in Qwen2.5, heads of 64.
KERNEL_MODEL = dict(n_embd=256, n_head=4, n_head_kv=2, n_ff=512, n_ctx=1024, logit_scale=8.0)


@pytest.fixture(scope="module")
def quantized_tiny(tmp_path_factory):
    """Factory: the tiny kernel model quantized to ``ftype``, written once per module."""
    folder = tmp_path_factory.mktemp("quantized")
    source = write_tiny_model(folder / "f32.gguf", TinySpec(**KERNEL_MODEL))
    made: dict[str, Path] = {}

    def make(ftype: str) -> Path:
        if ftype not in made:
            made[ftype] = quantize_tiny_model(source, folder / f"{ftype}.gguf", ftype)
        return made[ftype]

    return make


@pytest.fixture(scope="module", params=["Q4_K_M", "Q6_K"])
def quantized_target(request, quantized_tiny):
    model = Model(quantized_tiny(request.param), n_ctx=1024, n_threads=2)
    yield model
    model.close()


# Each side of every kernel switch: repacked q4_K takes a gemv that reads each weight block once for up to
# 3 rows, and with AVX-512 VNNI the tiled kernel from 32 rows (2-9, 31, 33), elsewhere the gemm's 4- and
# 16-row blocks with the gemv for the rows left (2-9, 15-17, 19); q6_K the small-batch GEMV up to 24 rows
# and the tiled kernel beyond (24, 25); a verification is as long as the longest lookup draft plus one (65)
# and never longer than MAX_VERIFY_BATCH, the largest batch flash attention keeps on its per-row exact path.
KERNEL_SWITCH_BATCHES = [2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 19, 24, 25, 31, 32, 33, 65, MAX_VERIFY_BATCH]
# Past the 512-entry KV length where stock llama.cpp splits a one-token attention across threads.
LONG_PREFIX = 520


@pytest.mark.parametrize("chunk", KERNEL_SWITCH_BATCHES)
def test_quantized_tiny_target_is_batch_invariant(quantized_target, chunk):
    """The patched kernels without the real pair: a build that loses bit-exactness fails here, in the
    `-m "not real"` run, on any weight type and batch size the real target verifies with."""
    model = quantized_target
    assert model.kernels == EXACT
    tokens = np.random.default_rng(chunk).integers(3, model.n_vocab, LONG_PREFIX + chunk).tolist()
    single, batched = _single_and_batched(model, tokens, LONG_PREFIX, chunk)
    assert len(single) == chunk
    assert np.array_equal(single, batched)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the exact kernels are x86 code")
def test_quantized_tiny_target_reaches_the_repacked_kernels(quantized_tiny, monkeypatch, capsys):
    """The Q4_K_M test above means something only if its q4_K weights are repacked as the real target's are
    (llama.cpp repacks q4_K where the CPU has AVX2)."""
    cpu_flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    if "avx2" not in cpu_flags:
        pytest.skip("no AVX2: llama.cpp has no repacked q4_K kernels here")
    import llama_cpp

    path = quantized_tiny("Q4_K_M")
    Model(path, vocab_only=True)  # routes llama.cpp's log to stderr under LOCALSPEC_DEBUG
    monkeypatch.setenv("LOCALSPEC_DEBUG", "1")
    # Loaded directly: Model's loader silences stderr while llama.cpp loads (and repacks) the weights.
    weights = llama_cpp.llama_model_load_from_file(str(path).encode(), llama_cpp.llama_model_default_params())
    llama_cpp.llama_model_free(weights)
    assert "blk.0.ffn_up.weight with q4_K_8x8" in capsys.readouterr().err


@pytest.mark.real
@pytest.mark.parametrize("chunk", KERNEL_SWITCH_BATCHES)
def test_real_target_is_batch_invariant(real_target, chunk):
    """Verified logits equal one-token logits bit for bit, with the kernels in use (repacked weights, flash
    attention), after a long prefix."""
    model = real_target
    assert model.kernels == EXACT
    code = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    tokens = model.tokenize(code * 30, add_bos=False)[: LONG_PREFIX + chunk]
    single, batched = _single_and_batched(model, tokens, LONG_PREFIX, chunk)
    assert len(single) == chunk
    assert np.array_equal(single, batched)


def _prefill_repacked_and_plain(repacked: Model, path: Path, tokens: list[int], prefill: bool, monkeypatch):
    """Logits of a prefill of ``tokens`` over repacked weights, and over the same file loaded without repacking."""
    from llama_cpp import _internals

    class PlainWeights(_internals.LlamaModel):  # the extra (repack) buffer types off, as llama.cpp's --no-repack
        def __init__(self, *, params, **kwargs):
            params.use_extra_bufts = False
            super().__init__(params=params, **kwargs)

    monkeypatch.setattr(_internals, "LlamaModel", PlainWeights)
    plain = Model(path, n_ctx=repacked.n_ctx, n_threads=repacked.n_threads)
    try:
        repacked.reset()
        return (repacked.eval(tokens, n_logits=len(tokens), prefill=prefill),
                plain.eval(tokens, n_logits=len(tokens), prefill=prefill))
    finally:
        plain.close()


# A prompt prefill takes the tiled kernel over repacked q4_K: past MAX_VERIFY_BATCH rows, or from 32 rows when
# the engine flags it (prefill=True). Loaded without repacking, the same kernel reads plain q4_K rows where exact
# mode runs plain q4_K through it (builds with AVX-512 VNNI): a misread weight, scale or min would move the
# logits, so they must agree bit for bit. Elsewhere exact mode keeps plain q4_K on vec_dot, which sums in
# another order, so there is no like-for-like reference.
PREFILLS = [(MAX_VERIFY_BATCH + 100, False), (64, True)]


def _skip_without_a_plain_tiled_reference() -> None:
    if not exact_kernels_built():
        pytest.skip("the repacked-prefill kernel comes with scripts/patches/llama-cpp-exact.patch")
    import llama_cpp

    if b"AVX512_VNNI = 1" not in llama_cpp.llama_print_system_info():
        pytest.skip("without AVX-512 VNNI exact mode reads plain q4_K with vec_dot: no like-for-like reference")


@pytest.mark.parametrize(("size", "prefill"), PREFILLS)
def test_tiny_prefill_reads_repacked_weights_as_plain_ones(quantized_tiny, monkeypatch, size, prefill):
    _skip_without_a_plain_tiled_reference()
    path = quantized_tiny("Q4_K_M")
    model = Model(path, n_ctx=1024, n_threads=2)
    tokens = np.random.default_rng(size).integers(3, model.n_vocab, size).tolist()
    try:
        repacked, plain = _prefill_repacked_and_plain(model, path, tokens, prefill, monkeypatch)
    finally:
        model.close()
    assert np.array_equal(repacked, plain)


@pytest.mark.real
@pytest.mark.parametrize(("size", "prefill"), PREFILLS)
def test_real_prefill_reads_repacked_weights_as_plain_ones(real_target, qwen_pair, monkeypatch, size, prefill):
    _skip_without_a_plain_tiled_reference()
    code = "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"
    tokens = real_target.tokenize(code * 30, add_bos=False)[:size]
    repacked, plain = _prefill_repacked_and_plain(real_target, qwen_pair[0], tokens, prefill, monkeypatch)
    assert np.array_equal(repacked, plain)


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
    model = Model(tiny_target, n_ctx=256, n_threads=1)
    tokens = model.tokenize("the code print x", add_bos=True)
    model.eval(tokens + [5, 6, 7, 8])
    model.rollback(len(tokens) - 1)
    assert model.tokens == tokens[:-1]
    again = model.eval(tokens[-1:])[0]
    fresh = Model(tiny_target, n_ctx=256, n_threads=1).eval(tokens)[0]
    assert np.array_equal(again, fresh)


def test_eval_returns_the_requested_rows(tiny_target):
    model = Model(tiny_target, n_ctx=256, n_threads=1)
    tokens = model.tokenize("hello world", add_bos=True)
    rows = model.eval(tokens, n_logits=3)
    assert rows.shape == (3, model.n_vocab)
    assert model.n_past == len(tokens)


def test_context_overflow_is_a_clear_error(tiny_target):
    model = Model(tiny_target, n_ctx=64, n_threads=1)
    with pytest.raises(ContextFullError, match="context window full"):
        model.eval(list(range(3, 70)))
    assert model.n_past == 0


def test_token_bytes_are_exact(tiny_target):
    model = Model(tiny_target, vocab_only=True)
    text = "hello world"
    assert b"".join(model.token_bytes(t) for t in model.tokenize(text, add_bos=False)).decode().strip() == text


def test_another_context_shares_the_weights_and_keeps_its_own_cache(tiny_target):
    model = Model(tiny_target, n_ctx=256, n_threads=1)
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
