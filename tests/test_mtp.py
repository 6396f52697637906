"""Drafting with a target's own MTP head, on tiny Qwen3.5-style (hybrid) models with one MTP block.

Two heads: a seeded-random one (it rarely agrees with its target, so nearly every draft rolls back), and
one that agrees by construction with a target whose trunk is weakened toward a bigram model (every draft
accepted when the trunk adds nothing; most, with every length of partial acceptance, when it adds a
little). Outputs are checked against the target alone; the head's state against a fresh head's.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from localspec.conversation import Conversation
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.drafters.base import RoundState
from localspec.engine.llama.model import Model
from localspec.errors import UsageError
from tests.test_bench_stock import run_bench, stock_bin  # noqa: F401 (a fixture)
from tests.test_decoder import ALPHA, exact_sequence_distribution, sequence_pvalue

PROMPT = "hello world the code print x = hello world the code"
N_CTX = 512
HEADS = {
    "random-head": dict(seed=3, logit_scale=8.0),
    "partly-agreeing-head": dict(seed=3, logit_scale=8.0, trunk_scale=0.4, mtp_agrees=True),
}
ROLLBACKS = {"checkpoint": 0, "snapshots": 8}


def mtp_model(make_tiny_model, name: str, **fields):
    return make_tiny_model(f"qwen35-mtp-{name}", architecture="qwen35", n_layers=4, mtp=True, **fields)


@pytest.fixture(scope="module", params=list(HEADS))
def head_model(request, make_tiny_model):
    return request.param, mtp_model(make_tiny_model, request.param, **HEADS[request.param])


def make_decoder(path, *, method="mtp", draft_len=None, snapshots=0, min_confidence=0.0) -> SpeculativeDecoder:
    # The target alone as a user runs it: without the head, nor the hidden states it reads.
    target = Model(path, n_ctx=N_CTX, n_threads=1, load_mtp=method != "none", rollback_snapshots=snapshots)
    decoder = SpeculativeDecoder(target, method=method, draft_len=draft_len)
    for drafter in decoder.drafters:
        if drafter.source == "mtp":
            drafter.min_confidence = min_confidence
    return decoder


def generate(decoder, prompt, max_tokens=60, sampling=SamplingParams()):
    return [t for step in decoder.generate(prompt, max_tokens=max_tokens, sampling=sampling) for t in step.tokens]


def rounds(decoder, prompt, max_tokens=60):
    return [(step.drafted, step.accepted) for step in decoder.generate(prompt, max_tokens=max_tokens)]


@pytest.fixture(scope="module")
def baseline(head_model):
    _, path = head_model
    decoder = make_decoder(path, method="none")
    prompt = decoder.target.tokenize(PROMPT, add_bos=True)
    return prompt, generate(decoder, prompt)


def test_the_head_loads_only_when_asked_and_mtp_needs_one(make_tiny_model, tiny_target):
    path = mtp_model(make_tiny_model, "random-head", **HEADS["random-head"])
    assert Model(path, n_ctx=64, load_mtp=True).mtp_layers == 1
    assert Model(path, n_ctx=64).mtp_layers == 0
    with pytest.raises(UsageError, match="method mtp needs the target's own MTP head"):
        SpeculativeDecoder(Model(tiny_target, n_ctx=64, load_mtp=True), method="mtp")
    assert all(d.source != "mtp" for d in SpeculativeDecoder(Model(path, n_ctx=64)).drafters)


def test_a_head_that_agrees_by_construction_has_every_greedy_draft_accepted(make_tiny_model):
    path = mtp_model(make_tiny_model, "agreeing-head", seed=3, logit_scale=8.0, trunk_scale=0.0, mtp_agrees=True)
    decoder = make_decoder(path, draft_len=4)
    prompt = decoder.target.tokenize(PROMPT, add_bos=True)
    out = generate(decoder, prompt)
    stats = decoder.stats
    assert stats.drafted > 30 and stats.accepted == stats.drafted
    assert stats.to_dict()["by_source"]["mtp"]["accepted"] == stats.accepted
    assert out == generate(make_decoder(path, method="none"), prompt)


@pytest.mark.parametrize("rollback", list(ROLLBACKS))
@pytest.mark.parametrize("method,draft_len", [("mtp", 3), ("mtp", None), ("mtp", 9), ("auto", None), ("lookup", 4)])
def test_greedy_output_of_every_method_equals_target_alone(head_model, baseline, method, draft_len, rollback):
    name, path = head_model
    prompt, expected = baseline
    decoder = make_decoder(path, method=method, draft_len=draft_len, snapshots=ROLLBACKS[rollback])
    assert generate(decoder, prompt) == expected
    if method == "mtp":
        assert decoder.stats.drafted_by_source.get("mtp", 0) > 0


@pytest.mark.parametrize("rollback", list(ROLLBACKS))
def test_partial_acceptances_of_every_length_roll_back_on_the_hybrid_target(make_tiny_model, rollback):
    path = mtp_model(make_tiny_model, "partly-agreeing-head", **HEADS["partly-agreeing-head"])
    decoder = make_decoder(path, draft_len=3, snapshots=ROLLBACKS[rollback])
    prompt = decoder.target.tokenize(PROMPT, add_bos=True)
    seen = {accepted for drafted, accepted in rounds(decoder, prompt) if drafted == 3}
    assert seen == {0, 1, 2, 3}
    assert generate(decoder, prompt) == generate(make_decoder(path, method="none"), prompt)


def test_the_head_after_rollbacks_drafts_as_a_fresh_head_would(head_model, baseline):
    """The head's cache is kept in step: after a generation full of rejections, its next draft (and the
    distribution it drew it from) is that of a head that saw the whole context at once."""
    _, path = head_model
    prompt, expected = baseline
    used = make_decoder(path, draft_len=5)
    assert generate(used, prompt) == expected
    assert_drafts_as_fresh(used, make_decoder(path, draft_len=5), prompt + expected, "mtp")


def assert_drafts_as_fresh(used: SpeculativeDecoder, fresh: SpeculativeDecoder, context: list[int], source) -> None:
    """``used`` (its target at ``context`` but the last token, after a generation) drafts from ``source`` what
    ``fresh`` does after one prefill of the same context: the same 5 tokens, drawn from the same q."""
    generate(fresh, context[:-1], max_tokens=1)  # the target evaluates the context but its last token
    sampling = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1)
    drafts = []
    for decoder in (used, fresh):
        assert decoder.target.n_past == len(context) - 1
        drafter = decoder.drafter(source)
        state = RoundState(context, 5, sampling, np.random.default_rng(7))
        drafts.append(drafter.draft(drafter.offer(state), 5, state))
    assert drafts[0].tokens == drafts[1].tokens and len(drafts[0].tokens) == 5
    for q_used, q_fresh in zip(drafts[0].q, drafts[1].q):
        np.testing.assert_allclose(q_used, q_fresh, atol=2e-3)  # the prompt prefilled in one batch


def test_three_turn_chat_and_an_early_stop_equal_the_target_alone(head_model):
    _, path = head_model
    questions = ["the code print x", "hello world the code", "def return x = x + x"]
    answers = {}
    for method, draft_len in (("none", None), ("mtp", 4), ("auto", None)):
        decoder = make_decoder(path, method=method, draft_len=draft_len)
        conversation = Conversation(decoder)
        answers[method] = ["".join(p.text for p in conversation.ask(q, max_tokens=24)) for q in questions]
        if method == "mtp":
            prompt = decoder.target.tokenize(PROMPT, add_bos=True)
            for i, _ in enumerate(decoder.generate(prompt, max_tokens=40)):
                if i == 3:
                    break  # a consumer that stops mid-answer, then the same prompt again
            assert generate(decoder, prompt) == generate(make_decoder(path, method="none"), prompt)
    assert answers["mtp"] == answers["none"] == answers["auto"]


def test_sampled_output_follows_the_target_distribution(make_tiny_model):
    path = mtp_model(make_tiny_model, "spread-head", seed=5, logit_scale=2.0, trunk_scale=0.4, mtp_agrees=True)
    prompt = Model(path, vocab_only=True).tokenize("hello world", add_bos=True)
    dist = exact_sequence_distribution(path, prompt)
    pvalue, drafted, accepted = sequence_pvalue(make_decoder(path, draft_len=2), prompt, dist)
    assert pvalue > ALPHA
    assert 0.1 * drafted < accepted < 0.9 * drafted


def test_run_json_shows_the_head_as_a_method(make_tiny_model):
    from localspec.cli.app import app

    path = mtp_model(make_tiny_model, "partly-agreeing-head", **HEADS["partly-agreeing-head"])
    texts = {}
    for method in ("none", "mtp"):
        result = CliRunner().invoke(app, ["run", "--json", "--threads", "1", PROMPT, "--target", str(path), "--raw",
                                          "--method", method, "--temp", "0", "-n", "40"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        texts[method] = data["text"]
    stats = data["stats"]
    assert stats["by_source"]["mtp"]["drafted"] > 0
    assert 0 < stats["controller"]["mtp_acceptance"] <= 1
    assert texts["mtp"] == texts["none"]


def test_serve_answers_three_requests_as_a_fresh_server_would(make_tiny_model):
    from localspec.session import ModelOptions, Pair, open_decoder
    from tests.test_hybrid import assert_serve_answers_as_fresh_servers_would

    path = mtp_model(make_tiny_model, "partly-agreeing-head", **HEADS["partly-agreeing-head"])

    def decoder():
        opened = open_decoder(Pair(path, None, "tiny"), ModelOptions(n_ctx=N_CTX, threads=1), method="mtp")
        assert "mtp" in {d.source for d in opened.drafters}  # the head drafts in these answers
        return opened

    assert_serve_answers_as_fresh_servers_would(decoder)


# --- where people look: check, doctor, profiles --------------------------------------------------------


def check_json(*args: str) -> tuple[int, dict]:
    from localspec.cli.app import app

    result = CliRunner().invoke(app, ["check", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def heads_detail(report: dict) -> str:
    return next(f["detail"] for f in report["findings"] if f["code"] == "heads")


def test_check_names_a_models_heads_alone_and_in_a_pair(make_tiny_model, tiny_target):
    path = mtp_model(make_tiny_model, "random-head", **HEADS["random-head"])
    code, report = check_json(str(path))
    assert code == 0 and "1 MTP head" in heads_detail(report) and "--method mtp" in heads_detail(report)
    code, report = check_json(str(tiny_target), str(path))
    assert code == 0
    assert "target: no built-in drafting heads" in heads_detail(report) and "draft: 1 MTP head" in heads_detail(report)


def test_doctor_and_profiles_name_the_head(make_tiny_model):
    from localspec.cli.app import app
    from localspec.cli.doctor import _memory_line

    path = mtp_model(make_tiny_model, "random-head", **HEADS["random-head"])
    assert "1 MTP head" in _memory_line(path)
    listing = CliRunner().invoke(app, ["profiles"], env={"COLUMNS": "250"})
    row = next(line for line in listing.stdout.splitlines() if line.startswith("qwen3.6-35b-a3b"))
    assert "its own MTP head" in row
    # A draft model whose size the profile does not pin is a draft model all the same.
    gemma = next(line for line in listing.stdout.splitlines() if line.startswith("gemma-3-27b"))
    assert "MTP" not in gemma and "?" in gemma
    shown = CliRunner().invoke(app, ["profiles", "show", "qwen3.6-35b-a3b"])
    assert "draft: none, the target drafts with its own MTP head" in shown.stdout


# --- mixture-of-experts targets ------------------------------------------------------------------------

MOE = dict(n_layers=4, n_expert=8, n_expert_used=2, n_ff_expert=32, seed=3, logit_scale=8.0)


@pytest.mark.parametrize("arch,methods", [("qwen35moe", ("lookup", "mtp", "auto")), ("qwen3moe", ("lookup", "auto"))])
def test_greedy_output_on_moe_targets_equals_target_alone(make_tiny_model, arch, methods):
    """Qwen3.6-35B-A3B's layout (hybrid, experts plus a shared one, an MTP block with experts too) and
    Qwen3-Coder-30B-A3B's (attention, experts)."""
    extra = dict(mtp=True, mtp_agrees=True, trunk_scale=0.4) if arch == "qwen35moe" else dict(head_dim=32)
    path = make_tiny_model(f"{arch}-target", architecture=arch, **MOE, **extra)
    prompt = Model(path, vocab_only=True).tokenize(PROMPT, add_bos=True)
    expected = generate(make_decoder(path, method="none"), prompt)
    for method in methods:
        decoder = make_decoder(path, method=method, draft_len=3 if method != "auto" else None)
        assert generate(decoder, prompt) == expected, method
        if method == "mtp":
            assert 0 < decoder.stats.accepted < decoder.stats.drafted


@pytest.mark.stock
@pytest.mark.slow
def test_the_stock_comparison_puts_draft_mtp_beside_localspec_mtp(stock_bin, make_tiny_model, tmp_path, monkeypatch):
    from localspec.bench import stock

    monkeypatch.setattr(stock, "TRUNCATED_ATTEMPTS", 30)  # tiny runs can outpace llama.cpp's log thread
    path = mtp_model(make_tiny_model, "partly-agreeing-head", **HEADS["partly-agreeing-head"])
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"workload": "echo", "id": "words", "prompt": PROMPT}) + "\n")
    out = tmp_path / "stock.json"
    result = run_bench(
        "--target", path, "--prompts", prompts, "--methods", "none", "--runs", 1, "--max-tokens", 24,
        "--ctx", 512, "--threads", 1, "--vs-llama-cpp", stock_bin, "--json", out,
    )
    assert result.exit_code == 0, result.output
    rows = {r["engine"]: r for r in json.loads(out.read_text())["rows"] if r["workload"] == "echo"}
    assert rows["stock draft-mtp"]["drafted"] > 0 and rows["localspec mtp k=auto"]["drafted"] > 0
    assert rows["localspec mtp k=auto"]["identical"]


@pytest.mark.parametrize("rollback", list(ROLLBACKS))
def test_the_head_reads_the_hidden_state_before_its_token_through_rollbacks(make_tiny_model, rollback):
    """A head that echoes the token the target's hidden state predicted: every first draft must be the
    context's last token, whatever rolled back before (an off-by-one or a stale row breaks the echo)."""
    path = mtp_model(make_tiny_model, "echoing-head", seed=3, logit_scale=8.0, trunk_scale=0.0, mtp_echoes=True)
    decoder = make_decoder(path, draft_len=3, snapshots=ROLLBACKS[rollback])
    drafter = decoder.drafter("mtp")
    seen = []
    draft = drafter.draft

    def observed(offer, k, state):
        made = draft(offer, k, state)
        seen.append((state.context[-1], made.tokens[0]))
        return made

    drafter.draft = observed
    questions = ["the code print x", "hello world the code", "def return x = x + x"]
    conversation = Conversation(decoder)
    for question in questions:
        "".join(p.text for p in conversation.ask(question, max_tokens=24))
    assert len(seen) > 20 and all(last == first for last, first in seen)
    assert decoder.stats.drafted > decoder.stats.accepted  # rejections happened, and rolled back
