"""Grammar-constrained decoding: valid output, and speculation lossless w.r.t. the constrained distribution."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from localspec.engine.decoding.constraints import GrammarConstraint, compact_json, json_schema_grammar
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams, probabilities
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.llama.model import Model
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
    assert stats.drafted > 0 and stats.target_passes <= alone_stats.target_passes  # drafts were judged, never to a loss
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
    assert stats.drafted_by_source["grammar"] == stats.accepted_by_source["grammar"] >= 10
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


# -- sampling: speculation follows the constrained distribution of the target alone --------------------------
# Free letters around a forced word: the draft model drafts letters (accepted or rejected by rejection
# sampling) and masked words; the grammar drafts the forced word.
LETTERS_GRAMMAR = 'start: /[a-e]/ /[a-e]/ "the" /[a-e]/'
SAMPLING = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
N_SAMPLES = 2000
ALPHA = 1e-3  # false-alarm rate of the goodness-of-fit test


def constrained_distribution(model_path, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """P(answer) for target-alone sampling under the mask, by enumerating the grammar's tree."""
    model = Model(model_path, n_ctx=256, n_threads=1)
    dist: dict[tuple[int, ...], float] = {}

    def walk(prefix: list[int], prob: float) -> None:
        constraint = GrammarConstraint(model, LETTERS_GRAMMAR)
        constraint.advance(prefix)
        model.reset()
        logits = model.eval(prompt + prefix)[:1].copy()
        constraint.restrict(logits)
        p = probabilities(logits[0], SAMPLING)
        for token in map(int, np.flatnonzero(p)):
            if model.is_end_of_generation(token):
                dist[tuple(prefix)] = dist.get(tuple(prefix), 0.0) + prob * p[token]
            else:
                walk(prefix + [token], prob * p[token])

    walk([], 1.0)
    return dist


def test_sampled_constrained_speculation_follows_the_constrained_target_alone(make_tiny_model):
    target = make_tiny_model("spread-target", seed=5, logit_scale=2.0)
    draft = make_tiny_model("spread-draft", seed=5, logit_scale=2.0, perturb_seed=9, perturb_scale=0.4)
    model = Model(target, n_ctx=256, n_threads=1)
    proposer = DraftModelDrafter(lambda: Model(draft, n_ctx=256, n_threads=1), min_confidence=0.0)
    decoder = SpeculativeDecoder(model, draft=proposer, method="draft", draft_len=2)
    prompt = model.tokenize("hello world", add_bos=True)
    dist = constrained_distribution(target, prompt)
    counts = dict.fromkeys(dist, 0)
    by_method: dict[str, list[int]] = {}
    for seed in range(N_SAMPLES):
        tokens, generation = generate(decoder, prompt, LETTERS_GRAMMAR, SamplingParams(**{**SAMPLING.__dict__,
                                                                                          "seed": seed}))
        counts[tuple(tokens)] += 1  # a KeyError is an answer the constrained target alone never gives
        for method, drafted in generation.drafted_by_source.items():
            totals = by_method.setdefault(method, [0, 0])
            totals[0] += drafted
            totals[1] += generation.accepted_by_source[method]
    keys = sorted(dist, key=dist.get, reverse=True)
    expected = np.array([dist[k] for k in keys]) * N_SAMPLES
    observed = np.array([counts[k] for k in keys], dtype=float)
    big = expected >= 5  # pool rare answers so every cell expects at least 5
    if not big.all():
        expected = np.append(expected[big], expected[~big].sum())
        observed = np.append(observed[big], observed[~big].sum())
    assert stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > ALPHA
    drafted, accepted = by_method["draft"]
    assert 0.1 * drafted < accepted < drafted  # acceptances and residual draws both happened
    assert by_method["grammar"][0] > 0  # the forced word was drafted by the grammar
