"""``localspec bench`` on tiny models: JSON schema, CSV, plot, bad input, the lossless comparison, the figures."""

from __future__ import annotations

import csv
import hashlib
import json
import time

import pytest
import tomli_w
from typer.testing import CliRunner

from localspec import paths
from localspec.bench import report, workloads
from localspec.bench.runner import (
    BASELINE,
    BenchResult,
    BenchRunner,
    BenchSettings,
    Config,
    Measurement,
    PromptRecord,
    compare_tokens,
    expected_speedup,
    measuring_order,
)
from localspec.bench.tuned_profile import write_tuned_profile
from localspec.bench.workloads import BenchPrompt
from localspec.cli.app import app
from localspec.engine.decoding.stats import GenerationStats
from localspec.engine.decoding.text import Step
from localspec.engine.drafters.dflash import DFlashDrafter
from localspec.engine.llama.model import Model
from localspec.engine.persist.history import LEAD_TOKENS
from localspec.engine.planner.controller import Controller
from localspec.engine.planner.costs import TRUSTED_SAMPLES
from localspec.errors import UsageError
from localspec.fim import fim_prompt
from localspec.profiles import DEFAULT_PROFILE, ModelSpec, load_profile
from localspec.session import ModelOptions, Pair, open_decoder
from localspec.store import cache as store
from tests.tiny_models import fim_fields

ROW_TYPES = {
    "workload": str,
    "method": str,
    "draft_len": (int, str, type(None)),
    "speedup": (float, int),
    "identical": bool,
    "acceptance_rate": (float, int),
    "tok_per_s": (float, int),
    "expected_speedup": (float, int, type(None)),
    "mean_accepted_length": (float, int),
    "per_position_acceptance": list,
    "target_passes": (float, int),
    "ttft_s": (float, int),
    "planned": dict,
    "per_prompt": list,
}


def run(*args: str):
    return CliRunner().invoke(app, ["bench", *map(str, args)])


def write_lines(path, *lines: str):
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture
def prompt_file(tmp_path):
    # Short prompts: the tiny models' vocabulary is mostly bytes, so long texts make long prompts.
    return write_lines(
        tmp_path / "prompts.jsonl",
        json.dumps(
            {"workload": "echo", "id": "words", "prompt": "hello world the code print x = hello world the code"}
        ),
        "",
        json.dumps({"workload": "session", "turns": ["def return x = x + x", "the world again"]}),
    )


def test_a_small_bench_writes_json_csv_and_plot(tiny_target, tiny_draft, prompt_file, tmp_path):
    out = tmp_path / "bench"
    result = run(
        "--target",
        tiny_target,
        "--draft",
        tiny_draft,
        "--prompts",
        prompt_file,
        "--methods",
        "none,lookup,draft,auto",
        "--draft-len",
        "2,auto",
        "--runs",
        2,
        "--max-tokens",
        24,
        "--ctx",
        512,
        "--json",
        f"{out}.json",
        "--csv",
        f"{out}.csv",
        "--plot",
        f"{out}.png",
    )
    assert result.exit_code == 0, result.output
    assert "recommended for echo" in result.output and "recommended for session" in result.output
    # The passes its decoders measured are kept for the sessions after it (3 rows: a draft of 2), relative to
    # a one-token pass (on these tiny models a pass is mostly fixed cost, so its value is near 1, either side).
    (remembered,) = json.loads(paths.pass_costs_file().read_text()).values()
    assert 0.5 < remembered.get("3", 0) < 5.0
    # stdout is not a terminal here, as in a file or a CI log: every header is whole, not cut at 80 columns.
    assert "…" not in result.stdout
    assert all(name in result.stdout for name in ("tok/pass", "per position", "passes", "TTFT s", "output"))

    document = json.loads((tmp_path / "bench.json").read_text())
    assert document["schema"] == report.SCHEMA
    assert document["settings"]["configs"] == [
        "none",
        "lookup k=2",
        "lookup k=auto",
        "draft k=2",
        "draft k=auto",
        "auto k=2",
        "auto k=auto",
    ]
    rows = document["rows"]
    assert [(r["workload"], r["method"], r["draft_len"]) for r in rows[:3]] == [
        ("echo", "none", None),
        ("echo", "lookup", 2),
        ("echo", "lookup", "auto"),
    ]
    assert len(rows) == 2 * 7
    for row in rows:
        for key, kind in ROW_TYPES.items():
            assert isinstance(row[key], kind), (key, row)
        assert row["identical"] is True and row["first_difference"] is None  # greedy speculation is lossless
        assert row["runs"] == 2 and row["generated_tokens"] > 0
    baseline = [r for r in rows if r["method"] == "none"]
    assert all(r["speedup"] == 1.0 and r["tok_per_s"] == r["baseline_tok_per_s"] for r in baseline)
    # auto priced its rounds: each choice's expected tokens against those it got (target alone: exactly one).
    planned = next(r for r in rows if r["method"] == "auto" and r["draft_len"] == "auto")["planned"]
    assert planned["none"]["tokens"] == planned["none"]["rounds"] > 0
    # a forced method with a fixed k is not priced
    assert all(r["planned"] == {} for r in rows if r["method"] in ("lookup", "draft") and r["draft_len"] == 2)
    drafts = [r for r in rows if r["method"] == "draft"]
    assert all(r["acceptance_rate"] > 0 and r["per_position_acceptance"] for r in drafts)
    assert {r["workload"] for r in document["recommendations"]} == {"echo", "session"}
    assert document["overall"]["workload"] == "*"

    with (tmp_path / "bench.csv").open() as f:
        lines = list(csv.DictReader(f))
    assert len(lines) == len(rows) and set(report.CSV_FIELDS) == set(lines[0])
    assert lines[1]["method"] == "lookup" and float(lines[1]["speedup"]) == rows[1]["speedup"]
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_the_plot_is_skipped_with_a_note(monkeypatch, tmp_path):
    monkeypatch.setitem(__import__("sys").modules, "matplotlib", None)  # makes `import matplotlib` fail
    assert report.write_plot(tmp_path / "p.png", []) is False
    assert not (tmp_path / "p.png").exists()


@pytest.mark.parametrize(
    "lines,expected",
    [
        ([], "no prompts in the file"),
        (["", "   "], "no prompts in the file"),
        (['{"workload": "a", "prompt": "x"}', '{"workload": "a", "prompt": '], "line 2: not valid JSON"),
        (['["a list"]'], "line 1: expected a JSON object"),
        (['{"workload": "a"}'], "line 1: give exactly one of 'prompt'"),
        (['{"workload": "a", "prompt": "x", "turns": ["y"]}'], "line 1: give exactly one of 'prompt'"),
        (['{"workload": "a", "turns": []}'], "line 1: 'turns' must be a non-empty list"),
        (['{"prompt": "x"}'], "line 1: 'workload' must be a non-empty string"),
        (['{"workload": "a", "prompt": "x", "temp": 1}'], "line 1: unknown key 'temp'"),
        (['{"workload": "a", "prompt": "x", "fim": {"prefix": "", "suffix": ""}}'], "line 1: give exactly one of"),
        (['{"workload": "a", "fim": {"prefix": "x"}}'], "line 1: 'fim' must be an object with 'prefix' and 'suffix'"),
        (['{"workload": "a", "fim": {"prefix": "", "suffix": "", "chunks": ["x"]}}'], "'fim.chunks' must be a list"),
        (['{"workload": "a", "fim": {"prefix": "", "suffix": "", "cursor": 3}}'], "unknown key fim.cursor"),
        (['{"workload": "a", "system": "s", "fim": {"prefix": "", "suffix": ""}}'], "a 'fim' prompt takes no 'system'"),
        (
            ['{"workload": "a", "id": "p", "prompt": "x"}', '{"workload": "a", "id": "p", "prompt": "y"}'],
            "'p' appears twice",
        ),
    ],
)
def test_bad_prompt_files_are_one_line_errors_naming_the_file(tmp_path, tiny_target, lines, expected):
    path = write_lines(tmp_path / "bad.jsonl", *lines)
    result = run("--target", tiny_target, "--prompts", path)
    assert result.exit_code == 2
    assert str(path) in result.output and expected in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args,expected",
    [
        (["--workloads", "code-edit,poetry"], "unknown workload 'poetry'; choose from code-edit, code-rewrite, code-new"),
        (["--methods", "none,telepathy"], "unknown method 'telepathy'"),
        (["--draft-len", "4,0"], "bad --draft-len item '0'"),
        (["--methods", "draft"], "needs a draft model"),
        (["--write-profile", "mine"], "--write-profile needs --profile"),
        (["--write-profile", "../escape"], "profile name '../escape' is not allowed"),
        (["--methods", "lookup+history"], "only auto+history uses an answer history"),
    ],
)
def test_bad_options_are_usage_errors(tiny_target, args, expected):
    result = run("--target", tiny_target, *args)
    assert result.exit_code == 2
    assert expected in result.output and "Traceback" not in result.output


def test_shipped_workloads_cover_every_slice_with_several_prompts():
    prompts = workloads.shipped_prompts()
    names = list(dict.fromkeys(p.workload for p in prompts))
    assert names == list(workloads.SHIPPED_ORDER)
    for name in names:
        assert sum(p.workload == name for p in prompts) >= 2
    assert all(len(p.turns) > 1 for p in prompts if p.workload == "multi-turn")
    quick = workloads.select(prompts, ["json", "code-edit"], per_workload=1)
    assert [p.workload for p in quick] == ["json", "code-edit"]


# -- the lossless comparison ---------------------------------------------------------------------
def test_configurations_measured_in_lockstep_time_only_their_own_rounds(tiny_target, tiny_draft):
    decoder = open_decoder(Pair(tiny_target, tiny_draft, "tiny"), ModelOptions(n_ctx=512, threads=1))
    configs = [BASELINE, Config("lookup"), Config("draft", 2), Config("auto")]
    runner = BenchRunner(decoder, BenchSettings(configs, runs=1, max_tokens=24, warmup_tokens=4))
    item = runner.prepare(BenchPrompt("echo", "words", ("hello world the code print x = hello world the code",)))
    runner.warm_up(item)
    started = time.perf_counter()
    together = runner.measure_together(item, configs)
    wall = time.perf_counter() - started
    alone = {config: runner.measure(item, config) for config in configs}
    for config in configs:
        # Every configuration ran on caches of its own: the same tokens whether interleaved or alone.
        assert together[config].tokens == alone[config].tokens == together[BASELINE].tokens
        stats = together[config].stats
        assert stats.generated_tokens == 24
        assert stats.decode_s == pytest.approx(stats.draft_s + stats.verify_s + stats.overhead_s + stats.rollback_s)
    # Interleaved, a generation's time is its own rounds, never another's: the times add up to at most the wall time.
    assert sum(m.stats.decode_s + m.stats.prefill_s for m in together.values()) <= wall


def test_every_configuration_goes_first_in_turn_across_prompts_even_with_one_run():
    engines = ["stock", "none", "lookup", "auto"]
    # One run per prompt, seven prompts: the rounds are the prompts, and the first measured changes with each.
    orders = [measuring_order(engines, round_index) for round_index in range(7)]
    assert [order[0] for order in orders] == ["stock", "none", "lookup", "auto", "stock", "none", "lookup"]
    # Each round measures every engine once, in the same cyclic order (so each follows the same one).
    for order in orders:
        assert sorted(order) == sorted(engines)
        start = engines.index(order[0])
        assert order == engines[start:] + engines[:start]


def test_compare_tokens_names_the_first_difference():
    describe = {1: "a", 2: "b", 3: "c", 9: "z"}.get
    assert compare_tokens([1, 2, 3], [1, 2, 3], describe) is None
    d = compare_tokens([1, 2, 3], [1, 9, 3], describe)
    assert (d.index, d.baseline, d.speculative, d.baseline_text, d.speculative_text) == (1, 2, 9, "b", "z")
    shorter = compare_tokens([1, 2, 3], [1, 2], describe)
    assert (shorter.index, shorter.baseline, shorter.speculative, shorter.speculative_text) == (2, 3, None, "")
    longer = compare_tokens([1], [1, 2], describe)
    assert (longer.index, longer.baseline, longer.speculative) == (1, None, 2)


def _measurement(tok_per_s: float, speedup: float, drafted: int = 0, accepted: int = 0) -> Measurement:
    stats = GenerationStats(generated_tokens=10, target_passes=10 - accepted, drafted=drafted, accepted=accepted)
    stats.verify_s = stats.generated_tokens / tok_per_s
    stats.first_token_s = 0.1
    return Measurement([1] * 10, stats, speedup=speedup, expected_speedup=speedup)


def _result(differences: dict[Config, object], speedups: dict[Config, float]) -> BenchResult:
    prompt = BenchPrompt("code-edit", "p1", ("edit this",))
    records = [PromptRecord(prompt, BASELINE, [_measurement(10.0, 1.0)])]
    for config, speedup in speedups.items():
        record = PromptRecord(prompt, config, [_measurement(10.0 * speedup, speedup, drafted=8, accepted=4)])
        record.difference = differences.get(config)
        records.append(record)
    return BenchResult(BenchSettings(list(speedups)), [prompt], records)


def test_a_differing_output_is_reported_and_never_recommended():
    fast_but_wrong, slower = Config("draft", 4), Config("lookup")
    difference = compare_tokens([5, 6, 7], [5, 6, 8], {7: "x", 8: "y"}.get)
    rows = report.build_rows(_result({fast_but_wrong: difference}, {fast_but_wrong: 3.0, slower: 1.5}))
    by_label = {report.row_label(r): r for r in rows}
    wrong = by_label["draft k=4"]
    assert wrong["identical"] is False
    assert wrong["first_difference"] == {
        "prompt": "p1",
        "index": 2,
        "baseline_token": 7,
        "speculative_token": 8,
        "baseline_text": "x",
        "speculative_text": "y",
    }
    assert by_label["lookup k=auto"]["identical"] is True and by_label["none"]["identical"] is True
    [choice] = report.recommend(rows)
    assert (choice.method, choice.draft_len, choice.speedup) == ("lookup", None, 1.5)
    assert report.recommend_overall(rows).method == "lookup"


def test_no_worthwhile_gain_means_do_not_speculate():
    rows = report.build_rows(_result({}, {Config("draft", 2): 0.8, Config("auto"): 1.02}))
    [choice] = report.recommend(rows)
    assert choice.method == "none" and choice.text == "do not speculate here (best speculative 1.02x)"


# -- the predicted speedup -----------------------------------------------------------------------
def test_expected_speedup_is_leviathans_formula_with_measured_costs():
    controller = Controller("draft", has_draft_model=True, draft_cost_ratio=0.25)
    for _ in range(TRUSTED_SAMPLES):
        controller.costs.record_pass(1, 0.060)
        controller.costs.record_pass(5, 0.105)
    # Prompt lookup, k = 4: one round fully accepted, one rejected at its first draft.
    steps = [Step([1] * 5, [], "lookup", 4, 4), Step([1], [], "lookup", 4, 0)]
    a = 4 / 5  # accepted / judged: the first round judged 4 drafts, the second only its first
    tokens = 1 + a + a**2 + a**3 + a**4
    assert expected_speedup(steps, controller) == pytest.approx(tokens * 0.060 / 0.105)
    # A draft model adds k draft steps per round (priced at the prior ratio until measured); plain rounds
    # are one token for one one-token pass.
    draft = [Step([1, 1, 1], [], "draft", 4, 2), Step([1], [], "none", 0, 0)]
    a = 2 / 3
    expected = lambda step: (1 + a + a**2 + a**3 + a**4 + 1) * 0.060 / (0.105 + 4 * step + 0.060)  # noqa: E731
    assert expected_speedup(draft, controller) == pytest.approx(expected(0.25 * 0.060))
    controller.record_draft("draft", 0, 0.0, 4, 4 * 0.030)
    assert expected_speedup(draft, controller) == pytest.approx(expected(0.030))
    # A fixed draft length never times a one-token pass: in a bench it shares the baseline's.
    fixed = Controller("draft", draft_len=4, has_draft_model=True, costs=controller.costs)
    fixed.record_draft("draft", 0, 0.0, 4, 4 * 0.030)
    assert expected_speedup(draft, fixed) == pytest.approx(expected(0.030))
    alone = Controller("draft", draft_len=4, has_draft_model=True)
    assert expected_speedup(draft, alone) is None  # no pass measured at all: no prediction


def test_expected_speedup_prices_a_block_drafter_as_the_planner_does():
    """A DFlash round drafting 6 tokens is one head pass of 7 rows, scaled like the target's 7-row pass
    (2.5 one-row passes here), not 6 steps."""
    controller = Controller(DFlashDrafter.source, drafters=[DFlashDrafter])
    for _ in range(TRUSTED_SAMPLES):
        controller.costs.record_pass(1, 0.100)
        controller.costs.record_pass(7, 0.250)
    controller.record_draft(DFlashDrafter.source, 0, 0.0, 7, 2.5 * 0.030)  # a one-row pass: 0.030 s
    steps = [Step([1] * 7, [], DFlashDrafter.source, 6, 6)]
    assert controller.round_seconds(DFlashDrafter.source, 6) == pytest.approx(0.250 + 2.5 * 0.030)
    assert expected_speedup(steps, controller) == pytest.approx(7 * 0.100 / (0.250 + 2.5 * 0.030))


# -- --write-profile -----------------------------------------------------------------------------
def test_a_tuned_profile_loads_with_the_recommended_defaults():
    base = load_profile(DEFAULT_PROFILE)
    path = write_tuned_profile("tuned", base, "lookup", 8, "defaults from localspec bench")
    tuned = load_profile("tuned")
    assert tuned.path == path
    assert (tuned.defaults.method, tuned.defaults.draft_len) == ("lookup", 8)
    assert tuned.target == base.target and tuned.draft == base.draft
    assert tuned.defaults.n_ctx == base.defaults.n_ctx
    with pytest.raises(UsageError):
        write_tuned_profile("bad/name", base, "auto", None, "x")


def test_write_profile_round_trips_a_description_beyond_the_bmp(tiny_target, tiny_draft, prompt_file):
    """An emoji is one character past U+FFFF: JSON would escape it as a surrogate pair, which TOML rejects."""
    profile: dict = {"description": "tiny pair 🚀, naïve"}
    for role, path in (("target", tiny_target), ("draft", tiny_draft)):
        data = path.read_bytes()
        spec = ModelSpec(repo="test/tiny", file=f"{role}.gguf", size=len(data), sha256=hashlib.sha256(data).hexdigest())
        store.model_path(spec).parent.mkdir(parents=True, exist_ok=True)
        store.model_path(spec).write_bytes(data)  # already cached: nothing to download
        profile[role] = {"repo": spec.repo, "file": spec.file, "size": spec.size, "sha256": spec.sha256}
    paths.user_profiles_dir().mkdir(parents=True)
    (paths.user_profiles_dir() / "tiny.toml").write_text(tomli_w.dumps(profile), encoding="utf-8")

    result = run("--profile", "tiny", "--prompts", prompt_file, "--workloads", "echo", "--methods", "none,lookup",
                 "--runs", 1, "--max-tokens", 8, "--ctx", 512, "--write-profile", "tuned")
    assert result.exit_code == 0, result.output
    tuned = load_profile("tuned")
    assert tuned.description.startswith("tiny pair 🚀, naïve; defaults from localspec bench")
    assert tuned.target == load_profile("tiny").target


@pytest.mark.parametrize("arch", ["qwen35", "mamba"])
def test_bench_on_a_hybrid_pair_matches_the_target_alone(make_tiny_model, prompt_file, tmp_path, arch):
    """The lockstep harness (a cache per configuration, a multi-turn session) on recurrent memory."""
    target = make_tiny_model(f"bench-{arch}", architecture=arch, seed=3, logit_scale=8.0)
    draft = make_tiny_model(f"bench-{arch}-draft", architecture=arch, seed=3, logit_scale=8.0, perturb_seed=1,
                            perturb_scale=0.5)
    result = run("--target", target, "--draft", draft, "--prompts", prompt_file, "--methods", "none,lookup,draft",
                 "--draft-len", "3", "--runs", 1, "--max-tokens", 24, "--ctx", 512, "--json", tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert len(rows) == 6 and all(row["identical"] for row in rows)
    assert any(0 < row["acceptance_rate"] < 1 for row in rows if row["method"] == "draft")


# -- the answer history: a cold pass, then a warm one ------------------------------------------
def test_the_answer_history_learns_each_prompt_once_in_the_cold_pass_and_drafts_in_the_warm_one(tiny_target):
    decoder = open_decoder(Pair(tiny_target, None, "tiny"), ModelOptions(n_ctx=512, threads=1), history=False)
    remembering = Config("auto", None, history=True)
    settings = BenchSettings([BASELINE, Config("auto"), remembering], runs=2, max_tokens=32, warmup_tokens=4)
    runner = BenchRunner(decoder, settings)
    prompts = [BenchPrompt("agents", f"p{i}", (text,)) for i, text in enumerate(["hello world", "the code", "x = 1"])]
    result = runner.run(prompts)

    assert [p.workload for p in result.prompts] == ["agents (cold)"] * 3 + ["agents (warm)"] * 3
    store = runner.decoders[remembering].history
    leads = [runner.prepare(prompt).tokens[-LEAD_TOKENS:] for prompt in prompts]
    answers = [r.runs[0].tokens for r in result.records if r.config == BASELINE][:3]
    assert len(store) == sum(len(lead) + len(answer) + 1 for lead, answer in zip(leads, answers))  # each once
    warm = [r for r in result.records if r.config == remembering and r.prompt.workload == "agents (warm)"]
    assert sum(m.stats.drafted_by_source.get("suffix", 0) for r in warm for m in r.runs) > 0
    assert all(r.difference is None for r in result.records)
    assert not paths.history_dir().exists()  # the bench never touches the user's history


def test_bench_reports_cold_and_warm_passes_with_each_requests_speedup(tiny_target, prompt_file, tmp_path):
    result = run("--target", tiny_target, "--prompts", prompt_file, "--workloads", "echo", "--methods",
                 "none,auto,auto+history", "--runs", 1, "--max-tokens", 8, "--ctx", 512, "--json", tmp_path / "b.json")
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    assert [(r["workload"], r["method"], r["history"]) for r in rows] == [
        (f"echo ({name})", method, history)
        for name in ("cold", "warm")
        for method, history in (("none", False), ("auto", False), ("auto", True))
    ]
    assert "auto+history k=auto per request:" in result.output


def test_the_completion_slice_is_llama_servers_infill_prompt_and_needs_fim_tokens(make_tiny_model, tiny_target,
                                                                                 tmp_path):
    fim = make_tiny_model("bench-fim", seed=0, logit_scale=8.0, **fim_fields())
    completion = write_lines(tmp_path / "completion.jsonl", json.dumps(
        {"workload": "completion", "id": "c", "fim": {"prefix": "def hello(x):\n", "suffix": "\nprint x\n",
                                                      "middle": "    re", "chunks": [{"text": "return x\n"}]}}))
    out = tmp_path / "fim.json"
    result = run("--target", fim, "--prompts", completion, "--methods", "none,lookup", "--runs", 1,
                 "--max-tokens", 8, "--ctx", 512, "--json", out)
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["workload"] for r in rows] == ["completion", "completion"] and rows[1]["identical"] is True
    (prompt,) = workloads.load_prompt_file(completion)
    runner = BenchRunner(open_decoder(Pair(fim, None, "fim"), ModelOptions(n_ctx=512, threads=1)),
                         BenchSettings([BASELINE]))
    assert runner.prepare(prompt).tokens == fim_prompt(Model(fim, vocab_only=True), prompt.fim, n_ctx=512)
    # A model without FIM tokens: the default slices leave the completions out and say so; named, refused.
    prompts = workloads.select(workloads.shipped_prompts(), ["completion", "chat"], per_workload=1)
    kept, note = workloads.for_target(prompts, Model(tiny_target, vocab_only=True), named=False)
    assert [p.workload for p in kept] == ["chat"] and "left out the completion slice" in note
    refused = run("--target", tiny_target, "--prompts", completion, "--runs", 1)
    assert refused.exit_code == 2 and "FIM prefix, suffix, middle token" in refused.output


def test_agent_repeat_runs_only_when_named():
    prompts = workloads.shipped_prompts()
    assert sum(p.workload == "agent-repeat" for p in prompts) == 20
    assert "agent-repeat" not in {p.workload for p in workloads.select(prompts, None)}
    assert len(workloads.select(prompts, ["agent-repeat"])) == 20
