"""The draft-and-verify loop on tiny generated models: lossless greedy and sampled output, KV rollback."""

from __future__ import annotations

import gc
import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from time import perf_counter

import numpy as np
import pytest
from scipy import stats

from localspec.engine.decoding import acceptance
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import InfillRule, SamplingParams, probabilities, sample
from localspec.engine.decoding.stats import GenerationStats
from localspec.engine.drafters.base import TARGET_ALONE
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.llama.model import Model
from localspec.engine.persist.history import HistoryStore
from localspec.errors import ContextFullError

PROMPTS = [
    "hello world the code print x = hello world the code",
    "def return x = x + x",
    "the world",
]
METHODS = [("lookup", None), ("lookup", 3), ("draft", None), ("draft", 2), ("hybrid", 4), ("auto", None)]


def make_decoder(
    target_path, draft_path=None, *, method="auto", draft_len=None, n_ctx=512, min_confidence=0.5, history=None,
    clock=perf_counter,
):
    # One thread: tiny models gain nothing from two, and OpenMP spinning slows a busy machine down.
    target = Model(target_path, n_ctx=n_ctx, n_threads=1)
    load = lambda: Model(draft_path, n_ctx=n_ctx, n_threads=1)  # noqa: E731
    draft = DraftModelDrafter(load, min_confidence=min_confidence) if draft_path else None
    on_answer = history.save if history is not None else None  # as the session saves it after each answer
    return SpeculativeDecoder(target, draft=draft, method=method, draft_len=draft_len, history=history,
                              on_answer=on_answer, clock=clock)


def ticks() -> Callable[[], float]:
    """A clock that advances one tick per reading: every timed pass, of one row or many, takes a tick, so
    auto's planner finds drafting free and drafts whatever is offered (where a test is about what happens
    to drafts, not whether they pay on a tiny model)."""
    return itertools.count().__next__


def generate(decoder, prompt_tokens, max_tokens=48, sampling=SamplingParams()):
    return [t for step in decoder.generate(prompt_tokens, max_tokens=max_tokens, sampling=sampling) for t in step.tokens]


@pytest.fixture(scope="module")
def baselines(tiny_target):
    decoder = make_decoder(tiny_target, method="none")
    prompts = [decoder.target.tokenize(p, add_bos=True) for p in PROMPTS]
    return [(p, generate(decoder, p)) for p in prompts]


@pytest.mark.parametrize("method,draft_len", METHODS)
def test_greedy_output_equals_target_alone(tiny_target, tiny_draft, baselines, method, draft_len):
    decoder = make_decoder(tiny_target, tiny_draft, method=method, draft_len=draft_len)
    drafted = 0
    for prompt, expected in baselines:
        assert generate(decoder, prompt) == expected
        drafted += decoder.stats.drafted
    if method != "auto":
        assert drafted > 0, "the method never speculated, so the test proved nothing"


def test_what_was_alive_before_an_answer_is_left_out_of_collections_until_it_ends(tiny_target, baselines):
    """A full garbage collection over the process took 46 ms mid-answer (SmolLM2-135M on a 2-core AMD EPYC,
    three passes); the decoder keeps what the answer found out of the collector's scans, and gives it back
    when the answer ends, however it ends."""
    decoder = make_decoder(tiny_target, method="lookup")
    prompt, expected = baselines[0]
    tokens, frozen = [], []
    for step in decoder.generate(prompt, max_tokens=48):
        tokens += step.tokens
        frozen.append(gc.get_freeze_count())
    assert tokens == expected
    assert min(frozen) > 10_000 and gc.get_freeze_count() == 0
    steps = decoder.generate(prompt, max_tokens=48)
    next(steps)
    steps.close()  # a consumer that stops early
    assert gc.get_freeze_count() == 0


def test_rejections_happen_with_a_perturbed_draft(tiny_target, tiny_draft, baselines):
    decoder = make_decoder(tiny_target, tiny_draft, method="draft", draft_len=4)
    generate(decoder, baselines[1][0])
    assert 0 < decoder.stats.accepted < decoder.stats.drafted


def test_model_as_its_own_draft_accepts_everything(tiny_target, baselines):
    decoder = make_decoder(tiny_target, tiny_target, method="draft", draft_len=4)
    assert generate(decoder, baselines[0][0]) == baselines[0][1]
    assert decoder.stats.drafted > 0 and decoder.stats.accepted == decoder.stats.drafted


def test_kv_cache_after_rejections_matches_fresh_evaluation(tiny_target, tiny_draft, baselines):
    decoder = make_decoder(tiny_target, tiny_draft, method="draft", draft_len=4)
    prompt = baselines[1][0]
    out = generate(decoder, prompt, max_tokens=40)
    assert decoder.stats.accepted < decoder.stats.drafted
    context = prompt + out
    assert decoder.target.tokens == context[:-1]
    next_logits = decoder.target.eval([context[-1]])[0]
    fresh = Model(tiny_target, n_ctx=512, n_threads=1).eval(context)[0]
    np.testing.assert_allclose(next_logits, fresh, atol=1e-3, rtol=1e-3)


def test_stopping_early_leaves_caches_consistent(tiny_target, tiny_draft, baselines):
    """A consumer that breaks mid-answer (Ctrl-C, a stop string) must not disturb the next generation."""
    prompt, expected = baselines[2]
    decoder = make_decoder(tiny_target, tiny_draft, method="hybrid", draft_len=4)
    steps = decoder.generate(prompt, max_tokens=48)
    next(steps), next(steps), next(steps)
    steps.close()
    assert generate(decoder, prompt) == expected
    # And continuing a conversation from a prefix of the cache works the same as a fresh session.
    fresh = make_decoder(tiny_target, method="none")
    follow_up = prompt + expected[:10] + prompt[1:5]
    assert generate(decoder, follow_up) == generate(fresh, follow_up)


def test_prompt_longer_than_context_is_a_clear_error(tiny_target):
    decoder = make_decoder(tiny_target, method="none", n_ctx=32)
    with pytest.raises(ContextFullError, match="context window"):
        generate(decoder, list(range(3, 40)))


def test_generation_stops_cleanly_at_a_full_context(tiny_target, tiny_draft):
    decoder = make_decoder(tiny_target, tiny_draft, method="hybrid", n_ctx=64)
    prompt = decoder.target.tokenize(PROMPTS[0], add_bos=True)
    out = generate(decoder, prompt, max_tokens=500)
    assert decoder.stats.stop_reason == "context_full"
    assert len(prompt) + len(out) == 65  # n_ctx tokens in the cache plus the last, unevaluated one
    assert out == generate(make_decoder(tiny_target, method="none", n_ctx=64), prompt, max_tokens=500)


# --- sampling: the speculative output distribution equals target-alone sampling ----------------------

SAMPLING = SamplingParams(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
N_TOKENS = 4
N_SAMPLES = 3000
ALPHA = 1e-3  # false-alarm rate of the goodness-of-fit test


@pytest.fixture(scope="module")
def spread_pair(make_tiny_model):
    target = make_tiny_model("spread-target", seed=5, logit_scale=2.0)
    draft = make_tiny_model("spread-draft", seed=5, logit_scale=2.0, perturb_seed=9, perturb_scale=0.4)
    return target, draft


def exact_sequence_distribution(model_path, prompt, sampling=SAMPLING):
    """P(first N_TOKENS tokens, or fewer before an end token) for target-alone sampling, by enumerating the top-k tree."""
    model = Model(model_path, n_ctx=256, n_threads=1)
    dist = {}

    def walk(prefix, prob):
        if len(prefix) == N_TOKENS:
            dist[tuple(prefix)] = prob
            return
        model.reset()
        p = probabilities(model.eval(prompt + prefix)[0], sampling)
        for token in np.flatnonzero(p):
            if model.is_end_of_generation(int(token)):
                dist[tuple(prefix)] = dist.get(tuple(prefix), 0.0) + prob * p[token]
            else:
                walk(prefix + [int(token)], prob * p[token])

    walk([], 1.0)
    return dist


def sequence_pvalue(decoder, prompt, dist, sampling=SAMPLING):
    """Chi-square p-value of N_SAMPLES seeded generations against ``dist``; also (drafted, accepted).

    A sequence that target-alone sampling can never produce makes the p-value 0.
    """
    counts = dict.fromkeys(dist, 0)
    drafted = accepted = impossible = 0
    for seed in range(N_SAMPLES):
        out = tuple(generate(decoder, prompt, N_TOKENS, replace(sampling, seed=seed)))
        if out in counts:
            counts[out] += 1
        else:
            impossible += 1
        drafted += decoder.stats.drafted
        accepted += decoder.stats.accepted
    keys = sorted(dist, key=dist.get, reverse=True)
    expected = np.array([dist[k] for k in keys]) * N_SAMPLES
    observed = np.array([counts[k] for k in keys], dtype=float)
    # Pool the rare sequences so every cell expects at least 5 samples.
    big = expected >= 5
    if not big.all():
        expected = np.append(expected[big], expected[~big].sum())
        observed = np.append(observed[big], observed[~big].sum())
    pvalue = stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue
    return (0.0 if impossible else pvalue), drafted, accepted


@pytest.fixture(scope="module")
def sampling_case(spread_pair):
    target, draft = spread_pair
    prompt = Model(target, vocab_only=True).tokenize("hello world", add_bos=True)
    return target, draft, prompt, exact_sequence_distribution(target, prompt)


@pytest.mark.parametrize("method", ["none", "draft", "lookup"])
def test_sampled_output_follows_target_distribution(sampling_case, method):
    target, draft, prompt, dist = sampling_case
    decoder = make_decoder(target, draft, method=method, draft_len=2, min_confidence=0.0)
    if method == "lookup":
        # Show the prompt once followed by the target's likeliest continuation, so lookup copies
        # plausible tokens that are sometimes accepted and sometimes not.
        likely = generate(make_decoder(target, method="none"), prompt, N_TOKENS)
        prompt = prompt + likely + prompt[1:]
        dist = exact_sequence_distribution(target, prompt)
    pvalue, drafted, accepted = sequence_pvalue(decoder, prompt, dist)
    assert pvalue > ALPHA
    if method != "none":
        # Both acceptances and rejections (residual draws) must have happened for the test to mean much.
        assert 0.1 * drafted < accepted < 0.9 * drafted


@pytest.mark.parametrize("method", ["draft", "lookup"])
def test_sampled_output_with_the_infill_sampler_follows_target_distribution(spread_pair, method):
    """Editors' chain (top-k, top-p, infill at temperature 1): its end-of-generation rule, merged tokens and
    thresholds are part of the distribution that drafts are accepted against."""
    target, draft = spread_pair
    sampling = replace(SAMPLING, top_k=8, infill=InfillRule(Model(target, vocab_only=True)))
    prompt = Model(target, vocab_only=True).tokenize("hello world", add_bos=True)
    if method == "lookup":
        likely = generate(make_decoder(target, method="none"), prompt, N_TOKENS)
        prompt = prompt + likely + prompt[1:]
    dist = exact_sequence_distribution(target, prompt, sampling)
    assert len(dist) > 3  # sampled, not one sure answer
    decoder = make_decoder(target, draft, method=method, draft_len=2, min_confidence=0.0)
    pvalue, drafted, accepted = sequence_pvalue(decoder, prompt, dist, sampling)
    assert pvalue > ALPHA
    assert 0.1 * drafted < accepted < 0.9 * drafted


def _bonus_from_draft(draft, q, p, rng):
    n, token = acceptance.verify_sampled(draft, q, p, rng)
    if q is not None and n == len(draft) and draft:
        token = sample(q[-1], rng)  # the bug: bonus token drawn from the draft's distribution
    return n, token


def _residual_is_p(draft, q, p, rng):
    for i, token in enumerate(draft):
        if rng.random() * q[i][token] < p[i][token]:
            continue
        return i, sample(p[i], rng)  # the bug: resampling from p instead of normalize(max(p - q, 0))
    return len(draft), sample(p[len(draft)], rng)


@pytest.mark.parametrize("broken", [_bonus_from_draft, _residual_is_p], ids=["bonus-from-draft", "residual-is-p"])
def test_the_distribution_check_catches_broken_rules(sampling_case, monkeypatch, broken):
    """Negative control: the same test must fail for the bugs peers have shipped."""
    target, draft, prompt, dist = sampling_case
    monkeypatch.setattr("localspec.engine.decoding.decoder.verify_sampled", broken)
    decoder = make_decoder(target, draft, method="draft", draft_len=2, min_confidence=0.0)
    assert sequence_pvalue(decoder, prompt, dist)[0] < ALPHA


def test_same_seed_same_output(spread_pair):
    target, draft = spread_pair
    decoder = make_decoder(target, draft, method="draft", draft_len=3)
    prompt = decoder.target.tokenize("the code", add_bos=True)
    sp = SamplingParams(temperature=0.8, seed=42)
    assert generate(decoder, prompt, 30, sp) == generate(decoder, prompt, 30, sp)




def test_auto_gives_up_a_draft_that_never_pays(make_tiny_model, tiny_target, baselines):
    """The catch-up loss: auto tried the draft, whose first use evaluates the whole prompt, then retried it
    after ever longer gaps. Here a draft ten times dearer per step than its target, wrongly priced as
    nearly free, is tried once, measured, and then left off for the rest of the session, and the stats
    say why."""
    slow = make_tiny_model("slow-draft", seed=3, n_layers=4, n_embd=256, n_ff=1024, logit_scale=8.0)
    target = Model(tiny_target, n_ctx=512, n_threads=1)
    draft = DraftModelDrafter(lambda: Model(slow, n_ctx=512, n_threads=1))
    decoder = SpeculativeDecoder(target, draft=draft, method="auto", draft_cost_ratio=0.01)
    prompt, expected = baselines[1]
    assert generate(decoder, prompt) == expected
    assert 1 <= decoder.stats.rounds_by_source.get("draft", 0) <= 2
    assert decoder.stats.draft_status.startswith("off for this session: a draft step costs")
    assert decoder.stats.to_dict()["draft_status"] == decoder.stats.draft_status
    held = list(draft.model.tokens)
    for prompt, expected in baselines:
        assert generate(decoder, prompt) == expected
        assert "draft" not in decoder.stats.rounds_by_source
    assert draft.model.tokens == held[: len(draft.model.tokens)]  # rolled back, never fed again


def test_each_priced_choice_shows_what_the_planner_expected_against_what_came(tiny_target, baselines):
    """Target alone yields one token a round, exactly as priced; its time is priced from the measured one-token
    passes; a copy round yields what it accepted plus the target's token."""
    decoder = make_decoder(tiny_target, method="auto")
    answers = []
    for prompt, expected in baselines * 2:
        assert generate(decoder, prompt) == expected
        answers.append(decoder.stats)
    stats = GenerationStats.pooled(answers)
    planned = stats.to_dict()["planned"]
    alone = planned[TARGET_ALONE]
    assert alone["rounds"] > 0 and alone["tokens"] == alone["rounds"] and alone["tokens_ratio"] == 1.0
    assert 0.3 < alone["time_ratio"] < 3.0, alone
    lookup = planned["lookup"]
    assert 0 < lookup["rounds"] <= stats.rounds_by_source["lookup"]
    assert lookup["rounds"] < lookup["tokens"] <= stats.accepted_by_source["lookup"] + lookup["rounds"]


def test_draft_catch_up_is_priced_as_proposed(tiny_target, tiny_draft, baselines):
    """What the controller is told a catch-up will cost is the batch propose then evaluates."""
    draft = DraftModelDrafter(lambda: Model(tiny_draft, n_ctx=512, n_threads=1), min_confidence=0.0)
    prompt, expected = baselines[1]
    rng = np.random.default_rng(0)
    assert draft.catch_up(prompt) == len(prompt) - 1  # the last token is the first step
    first = draft.propose(prompt, 3, SamplingParams(), rng)
    assert (first.catch_up_tokens, first.steps) == (len(prompt) - 1, 3)
    context = prompt + first.tokens[:2] + [expected[0]]
    assert draft.catch_up(context) == 0  # in step: the accepted tokens are evaluated by the first step
    second = draft.propose(context, 2, SamplingParams(), rng)
    assert (second.catch_up_tokens, second.steps) == (0, 2)
    draft.sync(context)
    assert draft.catch_up(context + expected[:10]) == 9


# --- suffix decoding: drafts from earlier answers never change an output token ------------------------


def test_a_warm_history_drafts_and_greedy_output_is_unchanged(tiny_target, baselines, localspec_home):
    """A second session finds the first session's answers on disk, drafts from them, and emits exactly
    target-alone's tokens; a history holding a wrong answer costs rejections, never a changed token."""
    path = localspec_home / "history" / "tiny.bin"
    first = make_decoder(tiny_target, history=HistoryStore(path))
    for prompt, expected in baselines:
        assert generate(first, prompt) == expected
    second = make_decoder(tiny_target, history=HistoryStore(path))
    suffix_drafted = 0
    for prompt, expected in baselines:
        assert generate(second, prompt) == expected
        suffix_drafted += second.stats.accepted_by_source.get("suffix", 0)
    assert suffix_drafted > 0, "the history was never drafted from, so the test proved nothing"

    wrong = HistoryStore(None)
    for prompt, expected in baselines:
        # Every eighth token of the stored answers is wrong: copies run, then fail there.
        wrong.add(prompt, [(t + 1) % 200 if i % 8 == 7 else t for i, t in enumerate(expected)])
    third = make_decoder(tiny_target, history=wrong)
    rejected = 0
    for _ in range(2):
        for prompt, expected in baselines:
            assert generate(third, prompt) == expected
            rejected += third.stats.drafted_by_source.get("suffix", 0) - third.stats.accepted_by_source.get("suffix", 0)
    assert rejected > 0


def test_suffix_drafts_scored_by_how_they_fared_leave_greedy_output_unchanged(tiny_target, baselines):
    """Each suffix draft's verification is fed back to the index, which drafts differently from then on
    (rejected continuations cut or outvoted), and every generation still emits target-alone's tokens."""
    store = HistoryStore(None)
    for prompt, expected in baselines:
        for _ in range(3):  # a wrong continuation with a majority, rejected until its outcomes outweigh it
            store.add(prompt, [(t + 1) % 200 if i % 8 == 7 else t for i, t in enumerate(expected)])
    fed_back = []
    record = store.index.record

    def spy(sources, accepted):
        fed_back.append((len(sources), accepted))
        record(sources, accepted)

    store.index.record = spy
    decoder = make_decoder(tiny_target, history=store)
    suffix_rounds = []
    for _ in range(3):
        for prompt, expected in baselines:
            steps = list(decoder.generate(prompt, max_tokens=48))
            assert [t for step in steps for t in step.tokens] == expected
            suffix_rounds += [(step.drafted, step.accepted) for step in steps if step.source == "suffix"]
    assert fed_back == suffix_rounds  # every suffix round, its drafted tokens' sources and how many passed
    assert any(accepted < drafted for drafted, accepted in fed_back), "no rejection was scored: the test proved nothing"


def test_sampled_output_with_suffix_drafts_follows_target_distribution(sampling_case):
    target, _, prompt, dist = sampling_case
    likely = generate(make_decoder(target, method="none"), prompt, N_TOKENS)
    history = HistoryStore(None)
    history.add(prompt, likely)
    history.learning = False  # the same proposals for every sample
    decoder = make_decoder(target, method="auto", draft_len=2, history=history, clock=ticks())
    generate(decoder, prompt, 8)  # auto measures a few one-token passes before it speculates
    by_method = Counter()
    plain = decoder.generate

    def counting(*args, **kwargs):
        yield from plain(*args, **kwargs)
        by_method.update(decoder.stats.drafted_by_source)

    decoder.generate = counting
    pvalue, drafted, accepted = sequence_pvalue(decoder, prompt, dist)
    assert pvalue > ALPHA
    assert by_method["suffix"] > 0.5 * drafted, by_method
    assert 0.1 * drafted < accepted < 0.9 * drafted


def test_closing_a_sibling_frees_its_own_caches_and_draft_and_leaves_the_original_answering(tiny_target, tiny_draft):
    decoder = make_decoder(tiny_target, tiny_draft, method="draft", draft_len=2)
    prompt = decoder.target.tokenize(PROMPTS[0], add_bos=True)
    expected = [t for s in decoder.generate(prompt, max_tokens=8) for t in s.tokens]
    sibling = decoder.sibling(method="draft", draft_len=2, history=None)
    assert [t for s in sibling.generate(prompt, max_tokens=8) for t in s.tokens] == expected
    drafter = sibling.drafter("draft")
    assert drafter.loaded
    sibling.close()
    assert not drafter.loaded  # its own context on the shared draft weights is freed
    assert [t for s in decoder.generate(prompt, max_tokens=8) for t in s.tokens] == expected


def test_a_sibling_prices_its_rounds_with_the_passes_the_original_timed_and_keeps_its_own_overheads(tiny_target):
    decoder = make_decoder(tiny_target, method="lookup", draft_len=3)
    prompt = decoder.target.tokenize(PROMPTS[0], add_bos=True)
    generate(decoder, prompt, 24)
    timed = decoder.controller.costs.measured_passes()
    assert set(timed) > {1}  # it verified drafts
    sibling = decoder.sibling(method="none", draft_len=None, history=None)
    assert sibling.controller.costs.measured_passes() == timed  # before it has timed a pass of its own
    samples = decoder.controller.costs.one_token_samples()
    generate(sibling, prompt, 4)
    assert decoder.controller.costs.one_token_samples() > samples  # its passes are the original's figures too
    # Its rounds' own work is its own: it never drafted.
    assert sibling.controller.overheads.drafting is None and decoder.controller.overheads.drafting is not None
    sibling.close()
