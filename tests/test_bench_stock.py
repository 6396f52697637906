"""``localspec bench --vs-llama-cpp``: reading stock llama.cpp's output, the table's figures, and the whole
comparison against the real stock tools on tiny models.

The parsing tests read output captured from the real tools (tests/data/stock/, see its README). The
end-to-end test needs the tools that scripts/build-llama-cpp-stock builds (about 5 minutes, once), which
scripts/test (and so CI) builds first; pytest on its own skips it, saying so, when they are not built.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec import paths
from localspec.bench import stock
from localspec.bench.stock import EngineRun, Round, StockOutputError, StockResult
from localspec.bench.workloads import BenchPrompt
from localspec.cli.app import app
from localspec.errors import UsageError
from localspec.fim import FimRequest
from tests.tiny_models import fim_fields

REPO = Path(__file__).resolve().parent.parent
DATA = Path(__file__).resolve().parent / "data" / "stock"


def captured(name: str) -> tuple[bytes, str]:
    """(stdout, stderr) of one real run of a stock tool."""
    return (DATA / f"{name}.stdout").read_bytes(), (DATA / f"{name}.stderr").read_text(encoding="utf-8")


def run_bench(*args) -> object:
    return CliRunner().invoke(app, ["bench", *map(str, args)])


@pytest.fixture(scope="session")
def stock_bin() -> Path:
    """The cached stock build, or a skip naming how to get it (pytest itself never builds it)."""
    done = subprocess.run([REPO / "scripts" / "build-llama-cpp-stock", "--cached"], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip("no cached stock llama.cpp build; run scripts/build-llama-cpp-stock once (about 5 minutes)")
    return Path(done.stdout.strip())


# -- parsing what the real tools print -----------------------------------------------------------
EXPECTED = json.loads((DATA / "expected.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ["llama-completion", "llama-completion-eos"])
def test_llama_completion_timings_and_answer_are_read_from_its_real_output(name):
    run = stock.parse_completion(*captured(name))
    expected = EXPECTED[name]
    assert (run.text, run.stopped) == (expected["text"], expected["stopped"])
    assert (run.prefill_tokens, run.decode_tokens) == (expected["prompt_tokens"], expected["eval_runs"])
    assert run.prefill_s == pytest.approx(expected["prompt_eval_ms"] / 1e3)
    # The decode's one-token passes and its share of choosing tokens (all sampled tokens but the first).
    runs = expected["eval_runs"]
    choosing_s = expected["sampling_ms"] * runs / (runs + 1) / 1e3
    assert run.decode_s == pytest.approx(expected["eval_ms"] / 1e3 + choosing_s)
    assert run.choosing_s == pytest.approx(choosing_s) and run.choosing_s > 0
    assert run.drafted is None and run.accepted is None


@pytest.mark.parametrize(
    "name",
    [
        "llama-speculative-simple-ngram-simple",
        "llama-speculative-simple-draft-simple",
        "llama-lookup",
        "llama-speculative-simple-ngram-mod-eos",
        "llama-lookup-eos",
    ],
)
def test_speculative_tools_timings_drafts_and_answer_are_read_from_their_real_output(name):
    expected = EXPECTED[name]
    echo = EXPECTED[expected["prompt"]]["echo"].encode("utf-8")
    run = stock.parse_speculative(*captured(name), echo, name)
    assert run.text == expected["text"]
    assert (run.prefill_tokens, run.prefill_s) == (expected["encoded"], pytest.approx(expected["encoded_s"]))
    assert (run.decode_tokens, run.decode_s) == (expected["decoded"], pytest.approx(expected["decoded_s"]))
    assert (run.drafted, run.accepted) == (expected["n_drafted"], expected["n_accept"])


def test_the_prompt_token_ids_come_from_verbose_prompt():
    _, stderr = captured("llama-completion-verbose-prompt")
    assert stock.parse_prompt_tokens(stderr) == EXPECTED["prompt"]["tokens"]


def test_a_speculative_tool_that_echoes_another_prompt_is_refused():
    stdout, stderr = captured("llama-lookup")
    with pytest.raises(StockOutputError, match="echoed another prompt"):
        stock.parse_speculative(stdout, stderr, b"a different prompt", "llama-lookup")


def test_output_cut_before_its_last_lines_is_recognised_as_truncated():
    # llama.cpp logs from a background thread and can exit before it has written everything.
    stdout, stderr = captured("llama-completion")
    with pytest.raises(stock.TruncatedOutputError):
        stock.parse_completion(stdout, stderr[: stderr.index("prompt eval time")])
    stdout, stderr = captured("llama-lookup")
    echo = EXPECTED["prompt"]["echo"].encode("utf-8")
    with pytest.raises(stock.TruncatedOutputError):
        stock.parse_speculative(stdout[:-2], stderr, echo, "llama-lookup")
    _, stderr = captured("llama-completion-verbose-prompt")
    with pytest.raises(stock.TruncatedOutputError, match="listed 7 of the 76 prompt tokens"):
        stock.parse_prompt_tokens(stderr[: stderr.index("    11 -> ','")])


# -- the figures -----------------------------------------------------------------------------------
def test_first_difference_is_the_first_differing_character():
    assert stock.first_difference("def f(x):", "def f(x):") is None
    d = stock.first_difference("return a + b", "return a - b", context=3)
    assert (d.index, d.baseline, d.other) == (9, "+ b", "- b")
    assert stock.first_difference("abc", "abcdef").index == 3  # one stopped early


def test_a_longer_answer_agrees_if_the_shorter_one_only_ran_out_of_budget():
    budget = EngineRun("def f(x):\n    return", 24, 1.0, 10, 0.1)
    longer = EngineRun("def f(x):\n    return x", 26, 1.0, 10, 0.1)  # llama-lookup accepts past -n
    assert stock.compare_runs(budget, longer) is None and stock.compare_runs(longer, budget) is None
    ended = EngineRun("def f(x):\n    return", 20, 1.0, 10, 0.1, stopped=True)
    assert stock.compare_runs(ended, longer).index == len(ended.text)  # one stopped where the other did not
    other = EngineRun("def g(x):\n    return x", 26, 1.0, 10, 0.1)
    assert stock.compare_runs(budget, other).index == 4


def _run(
    rate: float, text: str = "same", drafted: int | None = None, accepted: int | None = None, decoded: int = 100
) -> EngineRun:
    return EngineRun(text, decoded, decoded / rate, prefill_tokens=50, prefill_s=0.5, drafted=drafted, accepted=accepted)


def test_rows_give_rates_ratios_to_stock_in_the_same_round_acceptance_and_agreement():
    base, spec, mine = stock.STOCK_BASELINE, stock.STOCK_ENGINES[1], stock.Engine("localspec none")
    edit, chat = BenchPrompt("code-edit", "a", ("p",)), BenchPrompt("chat", "b", ("q",))
    rounds = [
        # Two runs on one prompt: the machine slowed down in the second, the ratio did not move.
        Round(edit, {base.label: replace(_run(20.0), choosing_s=0.5), spec.label: _run(30.0, "same", 10, 5), mine.label: _run(19.0)}),
        # The second run's last draft was accepted past the budget of 100 tokens.
        Round(edit, {base.label: _run(10.0), spec.label: _run(15.0, "same", 10, 7, 148), mine.label: _run(9.5)}),
        Round(chat, {base.label: _run(20.0, "x=1"), spec.label: _run(20.0, "x=2", 4, 0), mine.label: _run(20.0, "x=1")}),
    ]
    rows = stock.build_rows(StockResult([base, spec, mine], rounds, max_tokens=100))
    assert [(r["workload"], r["engine"]) for r in rows] == [
        (w, e) for w in ("code-edit", "chat", "all") for e in (base.label, spec.label, mine.label)
    ]
    by = {(r["workload"], r["engine"]): r for r in rows}
    assert by["code-edit", base.label]["decode_tok_per_s"] == 15.0  # median of 20 and 10
    assert by["code-edit", spec.label]["decode_ratio"] == 1.5
    assert by["code-edit", mine.label]["decode_ratio"] == 0.95
    assert by["code-edit", spec.label]["prefill_ratio"] == 1.0
    assert (by["code-edit", spec.label]["accepted"], by["code-edit", spec.label]["drafted"]) == (12, 20)
    assert by["code-edit", mine.label]["drafted"] is None
    assert by["code-edit", spec.label]["past_budget"] == 24.0  # median of 0 and 48
    assert by["code-edit", mine.label]["past_budget"] == 0.0 and by["chat", spec.label]["past_budget"] == 0.0
    assert by["chat", spec.label]["identical"] is False
    difference = {"prompt": "chat/b", "index": 2, "baseline": "1", "other": "2"}
    assert by["chat", spec.label]["differences"] == [difference]
    assert by["chat", mine.label]["identical"] is True
    # Stock's sampler time, as a share of its decode: 0.5 of 5 s in one run of two, none in the other.
    assert by["code-edit", base.label]["choosing_share"] == 0.05 and by["code-edit", mine.label]["choosing_share"] == 0
    # Over all slices: the geometric mean of the per-prompt ratios, drafts pooled.
    assert by["all", spec.label]["decode_ratio"] == pytest.approx((1.5 * 1.0) ** 0.5, abs=1e-3)
    assert by["all", spec.label]["acceptance_rate"] == pytest.approx(12 / 24, abs=1e-4)


def test_rows_give_how_far_apart_runs_put_one_prompts_decode_ratio():
    base, mine = stock.STOCK_BASELINE, stock.Engine("localspec auto k=auto")
    edit, chat = BenchPrompt("code-edit", "a", ("p",)), BenchPrompt("chat", "b", ("q",))
    rounds = [
        Round(edit, {base.label: _run(20.0), mine.label: _run(24.0)}),
        Round(edit, {base.label: _run(20.0), mine.label: _run(18.0)}),
        Round(edit, {base.label: _run(10.0), mine.label: _run(10.5)}),
        Round(chat, {base.label: _run(20.0), mine.label: _run(21.0)}),
        Round(chat, {base.label: _run(20.0), mine.label: _run(20.0)}),
    ]
    rows = stock.build_rows(StockResult([base, mine], rounds, max_tokens=100))
    by = {(r["workload"], r["engine"]): r for r in rows}
    assert by["code-edit", mine.label]["decode_ratio"] == 1.05  # the median of 1.2, 0.9 and 1.05
    assert by["code-edit", mine.label]["decode_ratio_range"] == [0.9, 1.2]
    assert by["chat", mine.label]["decode_ratio_range"] == [1.0, 1.05]
    assert by["all", mine.label]["decode_ratio_range"] == [0.9, 1.2]  # the prompt where runs lie furthest apart
    assert by["code-edit", base.label]["decode_ratio_range"] == [1.0, 1.0]


def test_localspec_rows_give_acceptance_per_draft_position_pooled_over_runs():
    base, mine = stock.STOCK_BASELINE, stock.Engine("localspec lookup k=auto")
    edit = BenchPrompt("code-edit", "a", ("p",))
    drafting = [  # drafts of 2 and 1 tokens, then of 3 and 1
        replace(_run(30.0, "same", 3, 2), position_drafted=(2, 1), position_accepted=(1, 1)),
        replace(_run(30.0, "same", 4, 3), position_drafted=(2, 1, 1), position_accepted=(2, 1, 0)),
    ]
    rounds = [Round(edit, {base.label: _run(20.0), mine.label: run}) for run in drafting]
    by = {r["engine"]: r for r in stock.build_rows(StockResult([base, mine], rounds, max_tokens=100))}
    assert by[mine.label]["per_position_acceptance"] == [0.75, 1.0, 0.0]
    assert by[base.label]["per_position_acceptance"] is None


def test_a_completion_is_measured_against_stock_llama_server_and_only_there():
    server, completion_tool, mine = stock.STOCK_SERVER, stock.STOCK_BASELINE, stock.Engine("localspec none")
    fim = BenchPrompt("completion", "c", (), fim=FimRequest("a", "b"))
    chat = BenchPrompt("chat", "b", ("q",))
    rounds = [Round(fim, {server.label: _run(20.0), mine.label: _run(30.0)}),
              Round(chat, {completion_tool.label: _run(20.0), mine.label: _run(10.0)})]
    rows = stock.build_rows(StockResult([completion_tool, server, mine], rounds, max_tokens=100))
    assert [(r["workload"], r["engine"]) for r in rows] == [
        ("completion", server.label), ("completion", mine.label), ("chat", completion_tool.label),
        ("chat", mine.label), ("all", completion_tool.label), ("all", server.label), ("all", mine.label)]
    by = {(r["workload"], r["engine"]): r for r in rows}
    assert by["completion", mine.label]["decode_ratio"] == 1.5 and by["chat", mine.label]["decode_ratio"] == 0.5
    assert by["all", mine.label]["decode_ratio"] == pytest.approx(0.75 ** 0.5, abs=1e-3)
    assert stock.reference(server.label) and not stock.reference(mine.label)


# -- errors ----------------------------------------------------------------------------------------
def test_a_missing_directory_or_tool_is_a_usage_error_naming_the_build_script(tmp_path):
    with pytest.raises(UsageError, match="no such directory; build them with scripts/build-llama-cpp-stock"):
        stock.find_tools(tmp_path / "nowhere")
    (tmp_path / "llama-completion").write_text("#!/bin/sh\n")
    (tmp_path / "llama-completion").chmod(0o755)
    with pytest.raises(UsageError, match="no executable llama-speculative-simple, llama-lookup, llama-server there"):
        stock.find_tools(tmp_path)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], "no such directory; build them with scripts/build-llama-cpp-stock"),
        (["--csv", "x.csv"], "--vs-llama-cpp has its own table and --json; drop --csv"),
        (["--temp", "0.7"], "compares greedy outputs; drop --temp"),
    ],
)
def test_bad_comparison_options_are_one_line_errors(tiny_target, tmp_path, extra, expected):
    result = run_bench("--target", tiny_target, "--vs-llama-cpp", tmp_path / "nowhere", *extra)
    assert result.exit_code == 2, result.output
    assert expected in result.output and "Traceback" not in result.output


def fake_tools(directory: Path, script: str) -> Path:
    """Stand-ins for the stock tools that misbehave as a broken build would (the real ones are tested below)."""
    for name in stock.STOCK_TOOLS:
        path = directory / name
        path.write_text("#!/bin/sh\n" + script)
        path.chmod(0o755)
    return directory


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        (
            "echo 'loading model' >&2\necho 'error: unknown argument: --no-escape' >&2\nexit 1\n",
            "failed (exit 1): error: unknown argument: --no-escape; run it by hand",
        ),
        (
            "echo 'loading model' >&2\n",
            f"printed no line like 'number of tokens in prompt = (\\\\d+)' in {stock.TRUNCATED_ATTEMPTS} runs: "
            "either it is not a build from "
            "scripts/build-llama-cpp-stock, or it lost the end of its log",
        ),
    ],
)
def test_a_failing_tool_is_one_line_naming_the_tool_and_the_cause(tiny_target, tmp_path, script, expected):
    tools = fake_tools(tmp_path, script)
    result = run_bench("--target", tiny_target, "--workloads", "chat", "--quick", "--vs-llama-cpp", tools)
    assert result.exit_code == 1, result.output
    assert "llama-completion" in result.output and expected in result.output
    assert "Traceback" not in result.output


# -- the real stock tools on tiny models -------------------------------------------------------------
@pytest.mark.stock
@pytest.mark.slow
def test_the_comparison_runs_every_engine_on_tiny_models(stock_bin, tiny_target, tiny_draft, tmp_path, monkeypatch):
    # A tiny model's run lasts milliseconds, often too short for llama.cpp's log thread to write anything
    # on a busy machine (one thread for llama.cpp helps: the log thread then competes with fewer spinning
    # threads); real models run long enough that a retry is rarely needed.
    monkeypatch.setattr(stock, "TRUNCATED_ATTEMPTS", 30)
    prompts = tmp_path / "prompts.jsonl"
    lines = [
        {"workload": "echo", "id": "words", "prompt": "hello world the code print x = hello world"},
        {"workload": "session", "id": "two", "turns": ["def return x = x + x", "the world again"]},
    ]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "stock.json"
    result = run_bench(
        "--target", tiny_target, "--draft", tiny_draft, "--prompts", prompts, "--methods", "none,lookup,draft",
        "--runs", 2, "--max-tokens", 16, "--ctx", 512, "--threads", 1, "--vs-llama-cpp", stock_bin, "--json", out,
    )
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert document["schema"] == stock.SCHEMA and document["settings"]["n_ctx"] == 512
    mine = ["localspec none", "localspec lookup k=auto", "localspec draft k=auto"]
    # No MTP head, no companion head: no draft-mtp, draft-eagle3 or draft-dflash.
    engines = [e.label for e in stock.STOCK_ENGINES if not (e.uses_head or e.uses_companion)] + mine
    assert document["settings"]["engines"] == engines
    rows = document["rows"]
    assert [(r["workload"], r["engine"]) for r in rows] == [(w, e) for w in ("echo", "session", "all") for e in engines]
    for row in rows:
        assert row["runs"] == 2 and row["decode_tok_per_s"] > 0 and row["prefill_tok_per_s"] > 0
        assert isinstance(row["identical"], bool)
        # The budget (llama-completion counts one token fewer: its first comes from the prompt pass;
        # llama-lookup and draft-simple may accept a draft past it).
        assert row["decoded_tokens"] >= 15, row
    baseline = [r for r in rows if r["engine"] == stock.STOCK_BASELINE.label]
    assert all(r["decode_ratio"] == 1.0 and r["prefill_ratio"] == 1.0 for r in baseline)
    # Its sampler's share of the decode is said beside the table, so no ratio passes for a faster pass.
    assert all(r["choosing_share"] > 0 for r in baseline)
    assert "choosing each token (its sampler chain)" in result.output
    drafting = [r for r in rows if r["engine"] in ("stock draft-simple", "localspec draft k=auto")]
    assert all(r["drafted"] > 0 for r in drafting)
    # Acceptance per draft position where the engine reports it: localspec's, not stock's tools' totals.
    assert all(r["per_position_acceptance"] for r in drafting if not r["stock"])
    assert all(r["per_position_acceptance"] is None for r in rows if r["stock"])
    assert "localspec draft k=auto accepted by draft position" in result.output
    # A slice of one prompt: its ratio, the median over runs, lies within what the runs gave.
    one_prompt = [row for row in rows if row["workload"] != "all"]
    assert all(low <= row["decode_ratio"] <= high for row in one_prompt for low, high in [row["decode_ratio_range"]])
    assert "between runs, one prompt's decode ratio moved by up to" in result.output
    assert "vs stock llama.cpp" in result.output
    # What localspec's decoders measured of the passes is kept for the sessions after it.
    (remembered,) = json.loads(paths.pass_costs_file().read_text()).values()
    assert remembered and all(int(size) > 1 and cost > 0 for size, cost in remembered.items())


@pytest.mark.stock
@pytest.mark.slow
def test_a_completion_runs_on_stock_llama_server_beside_localspec(stock_bin, make_tiny_model, tmp_path):
    target = make_tiny_model("stock-fim-target", seed=0, logit_scale=8.0, **fim_fields())
    draft = make_tiny_model("stock-fim-draft", seed=0, logit_scale=8.0, perturb_seed=1, perturb_scale=0.5,
                            **fim_fields())
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"workload": "completion", "id": "c", "fim": {
        "prefix": "def hello(x):\n    return x\n\n", "suffix": "ld(x):\n    print x\n", "middle": "def wor",
        "chunks": [{"filename": "a.py", "text": "the code print x = x + world\n"}]}}) + "\n")
    out = tmp_path / "stock.json"
    result = run_bench("--target", target, "--draft", draft, "--prompts", prompts, "--methods", "none,lookup",
                       "--runs", 1, "--max-tokens", 16, "--ctx", 2048, "--threads", 1, "--vs-llama-cpp", stock_bin,
                       "--json", out)
    assert result.exit_code == 0, result.output
    rows = {row["engine"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == [e.label for e in stock.STOCK_SERVER_ENGINES] + ["localspec none", "localspec lookup k=auto"]
    assert rows[stock.STOCK_SERVER.label]["decode_ratio"] == 1.0
    assert all(row["decode_tok_per_s"] > 0 and row["prefill_tok_per_s"] > 0 for row in rows.values())
    assert rows["stock server draft-simple"]["drafted"] > 0
    assert isinstance(rows["localspec none"]["identical"], bool)


def test_the_overall_rows_are_the_all_rows_or_the_only_workloads():
    rows = [{"workload": w, "engine": e} for w in ("a", "b", "all") for e in ("x", "y")]
    assert stock.overall_rows(rows) == rows[4:]
    assert stock.overall_rows(rows[:2]) == rows[:2]  # one workload: no "all" rows are made


def test_a_stock_server_that_exits_at_start_is_one_line_with_its_last_words(tmp_path):
    """Its log is read before it is closed (reading it after gave a traceback instead of the reason)."""
    tool = tmp_path / "llama-server"
    tool.write_text("#!/bin/sh\necho 'failed to connect to RPC server 127.0.0.1:50062'\nexit 1\n")
    tool.chmod(0o755)
    with pytest.raises(stock.StockOutputError, match="llama-server did not start: failed to connect to RPC server"):
        stock.StockServer([str(tool)])
