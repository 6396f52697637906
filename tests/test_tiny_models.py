"""The tiny recurrent and hybrid test models load in llama.cpp and compute, and so does the Qwen3.5-shaped
model of scripts/models/hybrid.py at a tiny size."""

from __future__ import annotations

from pathlib import Path

import llama_cpp
import numpy as np
import pytest

from localspec.engine.llama.model import Model
from scripts.models import hybrid
from tests.tiny_models import TinySpec, write_tiny_model


def next_token_logits(path: Path, tokens: list[int]) -> np.ndarray:
    model = Model(path, n_ctx=256)
    try:
        return model.eval(tokens, n_logits=1)[-1].copy()
    finally:
        model.close()


def n_rs_seq_granted(model: Model, asked: int) -> int:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_rs_seq = 256, asked
    ctx = llama_cpp.llama_init_from_model(model._model.model, params)
    try:
        return llama_cpp.llama_n_rs_seq(ctx)
    finally:
        llama_cpp.llama_free(ctx)


@pytest.mark.parametrize(
    "architecture, recurrent, hybrid, rollback",
    [("qwen35", False, True, 8), ("lfm2", False, True, 8), ("mamba", True, False, 0)],
)
def test_each_recurrent_architecture_loads_computes_and_keeps_the_rollback_llama_cpp_gives_it(
    tmp_path, architecture, recurrent, hybrid, rollback
):
    path = write_tiny_model(tmp_path / "model.gguf", TinySpec(architecture=architecture))
    model = Model(path, n_ctx=256)
    try:
        assert llama_cpp.llama_model_is_recurrent(model._model.model) is recurrent
        assert llama_cpp.llama_model_is_hybrid(model._model.model) is hybrid
        # Partial rollback (n_rs_seq) is for the hybrids; llama.cpp clamps it to 0 for mamba.
        assert n_rs_seq_granted(model, 8) == rollback
        prompt = model.tokenize("hello world def", add_bos=True)
    finally:
        model.close()
    logits = next_token_logits(path, prompt)
    assert np.isfinite(logits).all()
    assert np.array_equal(logits, next_token_logits(path, prompt))
    assert not np.allclose(logits, next_token_logits(path, prompt[:-1] + [prompt[-1] + 1]))


def test_the_qwen35_0_8b_shaped_script_writes_a_loadable_hybrid_at_a_tiny_size(tmp_path):
    spec = hybrid.qwen35_0_8b_spec(layers=4, embd=64, vocab=512)
    path = hybrid.make_hybrid_model(tmp_path / "hybrid.gguf", spec)
    model = Model(path, n_ctx=256)
    try:
        assert llama_cpp.llama_model_is_hybrid(model._model.model)
        assert (model.n_vocab, llama_cpp.llama_model_n_layer(model._model.model)) == (512, 4)
    finally:
        model.close()
    assert np.isfinite(next_token_logits(path, [1, 300, 301])).all()


def test_the_script_quantizes_through_llama_cpp(tmp_path):
    out = tmp_path / "q.gguf"
    hybrid.main([str(out), "--layers", "4", "--embd", "64", "--vocab", "512", "--type", "Q8_0"])
    assert [p.name for p in tmp_path.iterdir()] == ["q.gguf"]  # the intermediate f16 file is cleaned up
    f16 = hybrid.make_hybrid_model(tmp_path / "f16.gguf", hybrid.qwen35_0_8b_spec(layers=4, embd=64, vocab=512))
    assert out.stat().st_size < 0.7 * f16.stat().st_size
    assert np.isfinite(next_token_logits(out, [1, 300, 301])).all()
