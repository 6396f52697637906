"""What only an EAGLE-3 head does (the behaviour it shares with DFlash heads: test_companion_heads.py)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.drafters.base import RoundState
from tests.test_companion_heads import LAYERS, TARGET, generate, make_decoder
from tests.tiny_models import write_tiny_eagle3_head, write_tiny_model


def test_a_head_with_its_own_smaller_vocabulary_drafts_only_those_tokens(tmp_path):
    """Published heads draft from the target's 32k likeliest tokens (their own output projection and d2t,
    the map back to the target's ids): llama.cpp gives every other token -inf, so none is ever drafted."""
    target = write_tiny_model(tmp_path / "target.gguf", TARGET)
    head = write_tiny_eagle3_head(tmp_path / "head-d2t.gguf", TARGET, LAYERS, draft_vocab=20)
    baseline = make_decoder((target, head), method="none")
    prompt = baseline.target.tokenize("hello world the code print x = hello world the code", add_bos=True)
    expected = generate(baseline, prompt)
    decoder = make_decoder((target, head), draft_len=4)
    assert generate(decoder, prompt) == expected
    assert decoder.stats.drafted_by_source.get("eagle3", 0) > 0
    context = prompt + expected
    generate(decoder, context[:-1], max_tokens=1)
    drafter = decoder.drafter("eagle3")
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    state = RoundState(context, 4, sampling, np.random.default_rng(3))
    draft = drafter.draft(drafter.offer(state), 4, state)
    assert len(draft.tokens) == 4 and all(t < 20 for t in draft.tokens)
    for q in draft.q:
        assert q[:20].sum() == pytest.approx(1.0) and not q[20:].any()
