"""Drafting with a companion head (EAGLE-3, DFlash) beside the target, on a tiny llama-graph target and a
seeded-random head written in llama.cpp's format for each (tests/tiny_models.py). A random head rarely
agrees with its target, so most drafts roll back; outputs are checked against the target alone, the head's
state against a fresh head's, and its sampled output against the target's exact distribution. What only one
kind does is tested in test_eagle3.py and test_dflash.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.cli.app import app
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.llama.model import Model
from localspec.errors import UsageError
from localspec.gguf.header import read_header
from localspec.gguf.heads import companion_head
from tests.test_bench_stock import run_bench, stock_bin  # noqa: F401 (a fixture)
from tests.test_decoder import ALPHA, exact_sequence_distribution, sequence_pvalue
from tests.test_mtp import assert_drafts_as_fresh
from tests.tiny_models import TinySpec, write_tiny_dflash_head, write_tiny_eagle3_head, write_tiny_model

PROMPT = "hello world the code print x = hello world the code"
N_CTX = 512
TARGET = TinySpec(seed=4, n_layers=3, logit_scale=4.0)
LAYERS = (0, 1, 2)
WRITERS = {"eagle3": write_tiny_eagle3_head, "dflash": write_tiny_dflash_head}
NAMES = {"eagle3": "an EAGLE-3", "dflash": "a DFlash"}


@pytest.fixture(scope="module", params=list(WRITERS))
def pair(request, tmp_path_factory):
    kind = request.param
    folder = tmp_path_factory.mktemp(kind)
    return write_tiny_model(folder / "target.gguf", TARGET), WRITERS[kind](folder / "head.gguf", TARGET, LAYERS)


def kind_of(pair) -> str:
    return read_header(pair[1])["general.architecture"]


def make_decoder(pair, *, method=None, draft_len=None) -> SpeculativeDecoder:
    """A decoder on ``pair`` with ``method`` (default: the head's own) and the head as its companion."""
    target_path, head_path = pair
    target = Model(target_path, n_ctx=N_CTX, n_threads=1)
    head = companion_head(head_path, read_header(head_path))
    method = method or head.kind
    return SpeculativeDecoder(target, method=method, draft_len=draft_len, head=None if method == "none" else head)


def generate(decoder, prompt, max_tokens=60, sampling=SamplingParams()):
    return [t for step in decoder.generate(prompt, max_tokens=max_tokens, sampling=sampling) for t in step.tokens]


@pytest.fixture(scope="module")
def baseline(pair):
    decoder = make_decoder(pair, method="none")
    prompt = decoder.target.tokenize(PROMPT, add_bos=True)
    return prompt, generate(decoder, prompt)


@pytest.mark.parametrize("method,draft_len", [(None, 1), (None, 4), (None, None), ("auto", None)])
def test_greedy_output_of_every_method_equals_target_alone(pair, baseline, method, draft_len):
    prompt, expected = baseline
    decoder = make_decoder(pair, method=method, draft_len=draft_len)
    assert generate(decoder, prompt) == expected
    if method is None:
        assert decoder.stats.drafted_by_source.get(kind_of(pair), 0) > 0


def test_the_head_after_rollbacks_drafts_as_a_fresh_head_would(pair, baseline):
    """The head's entries are kept in step with the context (EAGLE-3: entry e from the token at e + 1 and g
    at e; DFlash: entry p from the target's layer inputs at p, the block taken back after every draft):
    after a generation full of rejections, its next draft and the distributions it drew it from are a fresh
    head's."""
    prompt, expected = baseline
    used = make_decoder(pair, draft_len=5)
    assert generate(used, prompt) == expected
    assert_drafts_as_fresh(used, make_decoder(pair, draft_len=5), prompt + expected, kind_of(pair))


def test_sampled_output_follows_the_target_distribution(pair):
    prompt = Model(pair[0], vocab_only=True).tokenize("hello world", add_bos=True)
    dist = exact_sequence_distribution(pair[0], prompt)
    pvalue, drafted, accepted = sequence_pvalue(make_decoder(pair, draft_len=2), prompt, dist)
    assert pvalue > ALPHA
    assert drafted > 0 and accepted > 0  # drafts were judged, and some kept: both paths of acceptance ran


def test_a_head_method_needs_its_head(pair):
    kind = kind_of(pair)
    target = Model(pair[0], n_ctx=N_CTX, n_threads=1)
    with pytest.raises(UsageError, match=f"{kind} needs {NAMES[kind]} head as the draft: the pair's draft is not"):
        SpeculativeDecoder(target, method=kind)


def test_run_json_shows_the_head_as_a_method(pair):
    kind, texts = kind_of(pair), {}
    for method in ("none", kind):
        result = CliRunner().invoke(app, ["run", "--json", "--threads", "1", PROMPT, "--target", str(pair[0]),
                                          "--draft", str(pair[1]), "--raw", "--method", method, "--temp", "0",
                                          "-n", "40"])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        texts[method] = data["text"]
    assert data["stats"]["by_source"][kind]["drafted"] > 0
    assert texts[kind] == texts["none"]


def check_json(*args: str) -> tuple[int, dict]:
    result = CliRunner().invoke(app, ["check", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def heads(report: dict) -> dict:
    return next(f for f in report["findings"] if f["code"] == "heads")


def test_check_accepts_a_fitting_head_and_names_what_keeps_another_from_its_target(pair, tmp_path):
    kind = kind_of(pair)
    code, report = check_json(str(pair[0]), str(pair[1]))
    assert code == 0, report
    assert heads(report)["title"] == f"The draft is {NAMES[kind]} head for this target"
    assert f"--method {kind}" in heads(report)["detail"]
    # The same head beside a wider, shallower target, and beside a target whose graph keeps no layer inputs.
    other = write_tiny_model(tmp_path / "wide.gguf", TinySpec(seed=4, n_layers=2, n_embd=128))
    code, report = check_json(str(other), str(pair[1]))
    assert code == 1
    assert "width 64, the target's are 128" in report["first_reason"]
    assert "target layers [2], the target has 2" in report["first_reason"]
    mamba = write_tiny_model(tmp_path / "mamba.gguf", TinySpec(architecture="mamba", seed=4, n_layers=3))
    code, report = check_json(str(mamba), str(pair[1]))
    assert code == 1 and "mamba graph does not expose its layer inputs" in report["first_reason"]
    # Alone, a head is no model to run: said, not refused.
    code, report = check_json(str(pair[1]))
    assert code == 0 and "give it as the draft" in heads(report)["detail"]


@pytest.mark.parametrize("spec", [
    # Qwen3.5's hybrid layout: rejected drafts roll the recurrent state back (checkpoint and replay).
    TinySpec(architecture="qwen35", seed=4, n_layers=4, logit_scale=4.0),
    # Qwen3-Coder-30B-A3B's: attention and experts.
    TinySpec(architecture="qwen3moe", seed=4, n_layers=3, logit_scale=4.0, head_dim=32,
             n_expert=4, n_expert_used=2, n_ff_expert=32),
], ids=["qwen35", "qwen3moe"])
@pytest.mark.parametrize("kind", list(WRITERS))
def test_greedy_output_on_hybrid_and_moe_targets_equals_target_alone(tmp_path, spec, kind):
    target = write_tiny_model(tmp_path / "target.gguf", spec)
    pair = (target, WRITERS[kind](tmp_path / "head.gguf", spec, LAYERS))
    baseline = make_decoder(pair, method="none")
    prompt = baseline.target.tokenize(PROMPT, add_bos=True)
    expected = generate(baseline, prompt)
    for draft_len in (3, None):
        decoder = make_decoder(pair, draft_len=draft_len)
        assert generate(decoder, prompt) == expected, draft_len
        assert decoder.stats.drafted_by_source.get(kind, 0) > 0


@pytest.mark.stock
@pytest.mark.slow
def test_the_stock_comparison_puts_stock_drafting_with_the_head_beside_localspec(stock_bin, pair, tmp_path, monkeypatch):
    from localspec.bench import stock

    kind = kind_of(pair)
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
    # The head is no draft model: stock's draft-simple is left out, its drafting with this kind of head runs
    # beside ours, the other kind's does not.
    other = next(k for k in WRITERS if k != kind)
    assert "stock draft-simple" not in rows and f"stock draft-{other}" not in rows
    assert rows[f"stock draft-{kind}"]["drafted"] > 0 and rows[f"localspec {kind} k=auto"]["drafted"] > 0
    assert rows[f"localspec {kind} k=auto"]["identical"]


def test_a_closed_sibling_frees_its_head_and_the_process_exits_cleanly(pair):
    """bench closes its configurations' decoders: freeing a head's own buffers must leave nothing for the
    process to free again (a DFlash head once handed llama.cpp Python's position rows to free)."""
    script = f"""
from tests.test_companion_heads import PROMPT, generate, make_decoder
decoder = make_decoder({tuple(map(str, pair))!r}, method="auto")
prompt = decoder.target.tokenize(PROMPT, add_bos=True)
sibling = decoder.sibling(method="{kind_of(pair)}", draft_len=None, history=None)
assert generate(sibling, prompt) == generate(decoder, prompt)
sibling.close()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 0, done.stderr[-2000:]


def test_bench_measures_the_target_alone_on_caches_that_keep_nothing_for_the_head(pair):
    """The decoder bench is given drafts with the head, so its caches keep the head's inputs on every pass;
    the baseline runs on caches of its own, which keep nothing: what it measures is the target alone."""
    from localspec.bench.runner import BASELINE, BenchRunner, BenchSettings, Config

    decoder = make_decoder(pair, method="auto")
    assert decoder.target.keeps_head_inputs
    runner = BenchRunner(decoder, BenchSettings([BASELINE, Config(kind_of(pair))], runs=1, max_tokens=8))
    try:
        baseline, drafting = runner.decoders[BASELINE], runner.decoders[Config(kind_of(pair))]
        assert baseline.target is not decoder.target and runner.target is baseline.target
        prompt = decoder.target.tokenize(PROMPT, add_bos=True)
        assert generate(baseline, prompt, max_tokens=8) == generate(drafting, prompt, max_tokens=8)
        assert not baseline.target.keeps_head_inputs and drafting.target.keeps_head_inputs
    finally:
        runner.close()
