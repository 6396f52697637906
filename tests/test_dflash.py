"""Drafting with a DFlash head beside the target, on a tiny llama-graph target and a seeded-random head
written in llama.cpp's dflash format (tests/tiny_models.py). A random head rarely agrees with its target,
so most drafts roll back; outputs are checked against the target alone, the head's state against a fresh
head's, and its sampled output against the target's exact distribution.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localspec.cli.app import app
from localspec.engine.backend import LlamaModel
from localspec.engine.controller import Controller
from localspec.engine.decoder import SpeculativeDecoder
from localspec.engine.dflash import DFlashDrafter
from localspec.engine.drafting import Offer, Source
from localspec.engine.mtp import MtpDrafter
from localspec.errors import UsageError
from localspec.gguf.header import read_header
from localspec.gguf.heads import companion_head
from tests.test_bench_stock import run_bench, stock_bin  # noqa: F401 (a fixture)
from tests.test_decoder import ALPHA, exact_sequence_distribution, sequence_pvalue
from tests.test_eagle3 import PROMPT, check_json, generate, heads
from tests.test_mtp import assert_drafts_as_fresh
from tests.tiny_models import TinySpec, write_tiny_dflash_head, write_tiny_model

N_CTX = 512
TARGET = TinySpec(seed=4, n_layers=3, logit_scale=4.0)
LAYERS = (0, 1, 2)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dflash")
    target = write_tiny_model(folder / "target.gguf", TARGET)
    return target, write_tiny_dflash_head(folder / "head.gguf", TARGET, LAYERS)


def make_decoder(pair, *, method="dflash", draft_len=None) -> SpeculativeDecoder:
    target_path, head_path = pair
    target = LlamaModel(target_path, n_ctx=N_CTX, n_threads=1)
    head = companion_head(head_path, read_header(head_path))
    return SpeculativeDecoder(target, method=method, draft_len=draft_len, head=None if method == "none" else head)


@pytest.fixture(scope="module")
def baseline(pair):
    decoder = make_decoder(pair, method="none")
    prompt = decoder.target.tokenize(PROMPT, add_bos=True)
    return prompt, generate(decoder, prompt)


@pytest.mark.parametrize("method,draft_len", [("dflash", 1), ("dflash", 4), ("dflash", None), ("auto", None)])
def test_greedy_output_of_every_method_equals_target_alone(pair, baseline, method, draft_len):
    prompt, expected = baseline
    decoder = make_decoder(pair, method=method, draft_len=draft_len)
    assert generate(decoder, prompt) == expected
    if method == "dflash":
        assert decoder.stats.drafted_by_method.get("dflash", 0) > 0


def test_a_draft_never_runs_past_the_trained_block(pair, baseline):
    """The head is trained on blocks of 8 (the last token and 7 masks): a longer draft is cut to 7."""
    prompt, expected = baseline
    decoder = make_decoder(pair, draft_len=12)
    rounds = list(decoder.generate(prompt, max_tokens=30))
    assert [t for step in rounds for t in step.tokens] == expected[:30]
    assert max(step.drafted for step in rounds) == 7


def test_the_head_after_rollbacks_drafts_as_a_fresh_head_would(pair, baseline):
    """Entry p holds the target's layer inputs at p and the block is taken back after every draft: after a
    generation full of rejections, the next draft and its distributions are a fresh head's."""
    prompt, expected = baseline
    used = make_decoder(pair, draft_len=5)
    assert generate(used, prompt) == expected
    assert_drafts_as_fresh(used, make_decoder(pair, draft_len=5), prompt + expected, Source.DFLASH)


def test_sampled_output_follows_the_target_distribution(pair):
    prompt = LlamaModel(pair[0], vocab_only=True).tokenize("hello world", add_bos=True)
    dist = exact_sequence_distribution(pair[0], prompt)
    pvalue, drafted, accepted = sequence_pvalue(make_decoder(pair, draft_len=2), prompt, dist)
    assert pvalue > ALPHA
    assert drafted > 0 and accepted > 0  # drafts were judged, and some kept: both paths of acceptance ran


@pytest.mark.parametrize("spec", [
    # Qwen3.5's hybrid layout: rejected drafts roll the recurrent state back (checkpoint and replay).
    TinySpec(architecture="qwen35", seed=4, n_layers=4, logit_scale=4.0),
    # Qwen3-Coder-30B-A3B's: attention and experts.
    TinySpec(architecture="qwen3moe", seed=4, n_layers=3, logit_scale=4.0, head_dim=32,
             n_expert=4, n_expert_used=2, n_ff_expert=32),
], ids=["qwen35", "qwen3moe"])
def test_greedy_output_on_hybrid_and_moe_targets_equals_target_alone(tmp_path, spec):
    target = write_tiny_model(tmp_path / "target.gguf", spec)
    pair = (target, write_tiny_dflash_head(tmp_path / "head.gguf", spec, LAYERS))
    baseline = make_decoder(pair, method="none")
    prompt = baseline.target.tokenize(PROMPT, add_bos=True)
    expected = generate(baseline, prompt)
    for draft_len in (3, None):
        decoder = make_decoder(pair, draft_len=draft_len)
        assert generate(decoder, prompt) == expected, draft_len
        assert decoder.stats.drafted_by_method.get("dflash", 0) > 0


def test_dflash_needs_a_dflash_head(pair):
    target = LlamaModel(pair[0], n_ctx=N_CTX, n_threads=1)
    with pytest.raises(UsageError, match="dflash needs a DFlash head as the draft: the pair's draft is not a DFlash head"):
        SpeculativeDecoder(target, method="dflash")


def test_run_json_shows_the_head_as_a_method(pair):
    texts = {}
    for method in ("none", "dflash"):
        result = CliRunner().invoke(app, ["run", "--json", "--threads", "1", PROMPT, "--target", str(pair[0]),
                                          "--draft", str(pair[1]), "--raw", "--method", method, "--temp", "0",
                                          "-n", "40"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        texts[method] = data["text"]
    assert data["stats"]["by_method"]["dflash"]["drafted"] > 0
    assert texts["dflash"] == texts["none"]


def test_check_accepts_a_fitting_head_and_names_what_keeps_another_from_its_target(pair, tmp_path):
    code, report = check_json(str(pair[0]), str(pair[1]))
    assert code == 0, report
    assert heads(report)["title"] == "The draft is a DFlash head for this target"
    assert "--method dflash" in heads(report)["detail"]
    other = write_tiny_model(tmp_path / "wide.gguf", TinySpec(seed=4, n_layers=2, n_embd=128))
    code, report = check_json(str(other), str(pair[1]))
    assert code == 1
    assert "width 64, the target's are 128" in report["first_reason"]
    assert "target layers [2], the target has 2" in report["first_reason"]


@pytest.mark.parametrize("key,value,named", [
    ("dflash.selector_top_k", 4, "a DFlash2 head"),
    ("dflash.sample_from_anchor", True, "a DSpark head"),
])
def test_a_dflash_descendant_is_refused_up_front_with_the_reason(pair, tmp_path, key, value, named):
    head = write_tiny_dflash_head(tmp_path / "variant.gguf", TARGET, LAYERS, extra={key: value})
    code, report = check_json(str(pair[0]), str(head))
    assert code == 1
    assert named in report["first_reason"] and "draft-dflash or draft-dspark" in report["first_reason"]
    result = CliRunner().invoke(app, ["run", "--threads", "1", PROMPT, "--target", str(pair[0]), "--draft", str(head),
                                      "--raw", "--method", "dflash", "-n", "8"])
    assert result.exit_code != 0 and (result.exception is None or isinstance(result.exception, SystemExit))
    assert named in result.output and "Traceback" not in result.output


def test_a_block_is_priced_as_one_pass_of_its_rows_not_a_step_per_token():
    """A head whose one-row pass costs 0.3 of a target pass: drafting 6 tokens costs one 7-row pass of it
    (scaled like the target's 7-row pass), where a chained head pays 6 steps."""
    plans = {}
    for cls in (DFlashDrafter, MtpDrafter):
        controller = Controller(cls.source, drafters=[cls], heads={cls.source: ""})
        for _ in range(3):
            controller.costs.record_pass(1, 0.100)
        for size in range(2, 17):
            for _ in range(3):
                controller.costs.record_pass(size, 0.100 * (1 + 0.25 * (size - 1)))
        rows = 7 if cls.block else 6
        steps_s = 0.030 * (1 + 0.25 * (rows - 1)) if cls.block else 0.030 * rows
        controller.record_draft(cls.source, 0, 0.0, rows, steps_s)
        assert controller.step_cost(cls.source) == pytest.approx(0.030)
        controller.record_round(cls.source, 0, 6, 6)
        plans[cls.source] = controller.plan([Offer(cls.source, 16)])
    block, chained = plans[Source.DFLASH], plans[Source.MTP]
    assert block.k > chained.k
    # The block's expected rate: its tokens over the target's pass and the head's pass, both of k + 1 rows.
    rows = 1 + 0.25 * block.k
    assert block.expected_rate == pytest.approx(block.expected_tokens / (0.100 * rows + 0.030 * rows), rel=0.02)


@pytest.mark.stock
@pytest.mark.slow
def test_the_stock_comparison_puts_draft_dflash_beside_localspec_dflash(stock_bin, pair, tmp_path, monkeypatch):
    from localspec.bench import stock

    monkeypatch.setattr(stock, "TRUNCATED_ATTEMPTS", 30)  # tiny runs can outpace llama.cpp's log thread
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"workload": "echo", "id": "words", "prompt": PROMPT}) + "\n")
    out = tmp_path / "stock.json"
    result = run_bench(
        "--target", pair[0], "--draft", pair[1], "--prompts", prompts, "--methods", "none", "--runs", 1,
        "--max-tokens", 24, "--ctx", 512, "--threads", 1, "--vs-llama-cpp", stock_bin, "--json", out,
    )
    assert result.exit_code == 0, result.output
    rows = {r["engine"]: r for r in json.loads(out.read_text())["rows"] if r["workload"] == "echo"}
    assert "stock draft-simple" not in rows and "stock draft-eagle3" not in rows
    assert rows["stock draft-dflash"]["drafted"] > 0 and rows["localspec dflash k=auto"]["drafted"] > 0
    assert rows["localspec dflash k=auto"]["identical"]
