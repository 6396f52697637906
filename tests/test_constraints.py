"""Grammar-constrained decoding: valid output, and speculation lossless w.r.t. the constrained distribution."""

from __future__ import annotations

import json

import numpy as np
import pytest

from localspec.engine.constraints import GrammarConstraint, compact_json, json_schema_grammar
from localspec.engine.sampling import SamplingParams
from localspec.errors import GrammarError
from localspec.session import ModelOptions, Pair, open_decoder
from localspec.tool_calls import HERMES, call_grammar

SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "tags": {"type": "array", "items": {"enum": ["a", "bb"]}, "maxItems": 3}},
          "required": ["ok", "n", "tags"], "additionalProperties": False}
MAX_TOKENS = 80


def generate(decoder, prompt: list[int], grammar: str, sampling=SamplingParams()) -> tuple[list[int], object]:
    constraint = GrammarConstraint(decoder.target, grammar)
    tokens = []
    for step in decoder.generate(prompt, max_tokens=MAX_TOKENS, sampling=sampling, constraint=constraint):
        tokens += step.tokens
    return tokens, decoder.stats


@pytest.fixture(scope="module")
def decoders(tiny_target, tiny_draft):
    """Target alone, and the same target speculating with lookup and a draft model (own KV caches)."""
    options = ModelOptions(n_ctx=1024, threads=1)
    alone = open_decoder(Pair(tiny_target, None, "t"), options, method="none")
    speculating = open_decoder(Pair(tiny_target, tiny_draft, "t"), options, method="draft", draft_len=4)
    return alone, speculating


@pytest.mark.parametrize("grammar", [
    json_schema_grammar(SCHEMA),
    json_schema_grammar({"type": "object"}),
    'start: "the answer is " ("yes" | "no") "."',
])
def test_constrained_speculation_emits_what_the_constrained_target_alone_emits(decoders, grammar):
    alone, speculating = decoders
    prompt = alone.target.tokenize("the code print x = hello world", add_bos=True)
    expected, alone_stats = generate(alone, prompt, grammar)
    got, stats = generate(speculating, prompt, grammar)
    assert got == expected and alone_stats.drafted == 0
    assert stats.drafted > 0 and stats.rounds <= alone_stats.rounds  # drafts were judged, never to a loss
    assert stats.stop_reason == "eos"  # the grammar finished and only the end of generation was allowed
    text = speculating.target.detokenize(got)
    if grammar.startswith("start: %json"):
        json.loads(text)
    else:
        assert text in ("the answer is yes.", "the answer is no.")


def test_the_grammar_forces_tokens_that_are_drafted_for_free(decoders):
    _, speculating = decoders
    prompt = speculating.target.tokenize("hello", add_bos=True)
    tokens, stats = generate(speculating, prompt, 'start: "def the code(): return x" ("1" | "2")')
    assert stats.drafted_by_method["grammar"] == stats.accepted_by_method["grammar"] >= 10
    assert speculating.target.detokenize(tokens) in ("def the code(): return x1", "def the code(): return x2")


def test_sampled_constrained_answers_always_follow_the_schema(decoders):
    _, speculating = decoders
    prompt = speculating.target.tokenize("the code", add_bos=True)
    for seed in range(5):
        sampling = SamplingParams(temperature=1.0, seed=seed)
        tokens, _ = generate(speculating, prompt, json_schema_grammar(SCHEMA), sampling)
        value = json.loads(speculating.target.detokenize(tokens))
        assert set(value) == {"ok", "n", "tags"} and set(value["tags"]) <= {"a", "bb"}


def test_each_row_is_masked_as_after_the_drafts_before_it(decoders):
    model = decoders[0].target
    constraint = GrammarConstraint(model, 'start: "x" "y"')
    spelling = {text: {t for t in range(model.n_vocab) if model.token_bytes(t) == text.encode()} for text in "xy"}
    # llguidance allows the letter's own token, not the byte-fallback token of the same text.
    [x] = np.flatnonzero(constraint.allowed())
    logits = np.zeros((3, model.n_vocab), dtype=np.float32)
    constraint.restrict(logits, [x, x])  # the second x is refused, so verification never reads row 2
    assert set(np.flatnonzero(np.isfinite(logits[0]))) == {x} and x in spelling["x"]
    assert set(np.flatnonzero(np.isfinite(logits[1]))) <= spelling["y"] and np.isfinite(logits[1]).any()
    assert logits[0, x] == 0 and np.isfinite(logits[2]).all()  # allowed logits and unread rows are left alone
    fresh = np.zeros((1, model.n_vocab), dtype=np.float32)
    constraint.restrict(fresh)  # restrict rolled its look-ahead back: still at the start
    assert set(np.flatnonzero(np.isfinite(fresh[0]))) == {x}


@pytest.mark.parametrize("parallel", [False, True])
def test_a_forced_call_grammar_admits_a_second_call_only_when_parallel(decoders, parallel):
    model = decoders[0].target
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}
    constraint = GrammarConstraint(model, call_grammar(HERMES, [tool], parallel=parallel, special={},
                                                       json_text=compact_json))
    call = b'<tool_call>\n{"name": "f", "arguments": {"n": 1}}\n</tool_call>'
    text, spelled = call + b"\n" + call, 0
    while spelled < len(text):  # spell the text with the longest allowed token each time
        pieces = {t: model.token_bytes(t) for t in np.flatnonzero(constraint.allowed())}
        fitting = [t for t, piece in pieces.items() if piece and text.startswith(piece, spelled)]
        if not fitting:
            break
        token = max(fitting, key=lambda t: len(pieces[t]))
        constraint.advance([token])
        spelled += len(pieces[token])
    assert spelled == (len(text) if parallel else len(call))
    assert constraint.allowed()[model.eos_id]  # after the last call the answer may end


def test_a_schema_llguidance_cannot_build_is_one_line_naming_the_fix(decoders):
    alone, _ = decoders
    with pytest.raises(GrammarError) as error:
        GrammarConstraint(alone.target, json_schema_grammar({"type": "integer", "minimum": 5, "maximum": 1}))
    assert "minimum (5) is greater than maximum (1)" in str(error.value) and "\n" not in str(error.value)
