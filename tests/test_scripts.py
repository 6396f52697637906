"""The measurement scripts of scripts/ keep running: each answers ``--help`` as the module the README
table names, and each runs its real code path on the tiny test models or in its smallest mode (figures
are not checked, only that every part ran). The replays' stand-in target provides the whole ``Target``
interface of the decoder, as the real model does."""

from __future__ import annotations

import json
import os
import re
import runpy
import shutil
import sys
from pathlib import Path

import llama_cpp
import pytest

from localspec.engine.decoding.target import Target
from localspec.engine.llama.model import Model
from localspec.gguf.header import read_header
from scripts.bench import builds, engine, heads, lookup_index, moe, rollback, server, suffix_index, tui
from scripts.bench.agents import free_port
from scripts.models import hybrid
from scripts.record import llama_vim, llama_vscode
from scripts.replay import lookup, spread, suffix
from scripts.replay.recording import Clock, ReplayTarget
from tests.test_bench_stock import stock_bin  # noqa: F401 (a fixture)
from tests.tiny_models import fim_fields

REPO = Path(__file__).resolve().parents[1]
# Scripts whose runs are tested beside the code they measure.
TESTED_ELSEWHERE = {
    "scripts.bench.agents": "tests/test_prompt_cache.py",  # replay and record against a tiny server
    "scripts.bench.gpu": "tests/test_gpu_check.py",  # models, quantize and report, with the stock tools
    "scripts.train_head": "tests/test_train_head.py",  # a short training on the tiny models
}
# For the scripts that write random models: one thread (tiny models gain nothing from two on a busy machine),
# and Q8_0, whose 32-wide blocks fit tiny widths (K-quants need 256).
SMALL = ["--threads", "1", "--type", "Q8_0"]


def script_modules() -> list[str]:
    """Every runnable module under scripts/ (the shared code beside them has no ``__main__``); a package with a
    ``__main__.py`` is run as the package."""
    return sorted(
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__main__")
        for path in (REPO / "scripts").glob("*/*.py")
        if 'if __name__ == "__main__":' in path.read_text()
    )


def smoke_run_here(module: str) -> bool:
    """Whether a test below runs ``module``: they are named for it (scripts.bench.engine: test_bench_engine_...)."""
    prefix = "test_" + "_".join(module.split(".")[1:]) + "_"
    return any(name.startswith(prefix) for name in globals())


# The module runs again as __main__ though the smoke runs below imported it: what -m does, so no surprise here.
@pytest.mark.filterwarnings("ignore:'scripts.* found in sys.modules after import of package:RuntimeWarning")
@pytest.mark.parametrize("module", script_modules())
def test_every_script_is_in_the_readme_table_runs_as_its_module_and_is_smoke_run(module, monkeypatch, capsys):
    readme = (REPO / "scripts" / "README.md").read_text()
    assert f"`.venv/bin/python -m {module}" in readme, f"scripts/README.md has no row for {module}"
    elsewhere = TESTED_ELSEWHERE.get(module)
    runs_there = elsewhere is not None and module.replace(".", "/") in (REPO / elsewhere).read_text()
    assert smoke_run_here(module) or runs_there, f"no smoke run of {module}"
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    with pytest.raises(SystemExit) as done:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert done.value.code == 0 and "usage:" in capsys.readouterr().out


# -- the Target interface ----------------------------------------------------------------------------------------
def target_members() -> set[str]:
    """What a runtime check of ``Target`` compares (typing.get_protocol_members from Python 3.13)."""
    return {name for name in (*vars(Target), *Target.__annotations__) if not name.startswith("_")}


def replay_target() -> ReplayTarget:
    return ReplayTarget(n_vocab=3, eos=2, cost=lambda batch: 0.001 * batch, clock=Clock())


def test_the_real_model_and_the_replay_target_provide_every_member_of_target(tiny_target):
    model = Model(tiny_target, n_ctx=256, n_threads=1)
    try:
        for target in (model, replay_target()):
            assert [m for m in sorted(target_members()) if not hasattr(target, m)] == [], type(target).__name__
            assert isinstance(target, Target)
    finally:
        model.close()


@pytest.mark.parametrize("missing", sorted(target_members()))
def test_a_stand_in_without_any_one_member_of_target_is_not_one(missing):
    full = replay_target()
    partial = type("Partial", (), {m: getattr(full, m) for m in target_members() - {missing}})()
    assert not isinstance(partial, Target)


# -- scripts.bench -------------------------------------------------------------------------------------------------
def test_bench_lookup_index_times_its_steps(capsys):
    lookup_index.main(["--sizes", "1000", "--steps", "50"])
    assert re.search(r"^ +1000 ", capsys.readouterr().out, re.M)


def test_bench_suffix_index_times_its_lookups(capsys):
    suffix_index.main(["--tokens", "20000", "--lookups", "20"])
    out = capsys.readouterr().out
    assert "20,000 tokens: built" in out and "unseen context: median" in out


def test_bench_rollback_tables_every_draft_length_on_a_hybrid(make_tiny_model, capsys):
    model = make_tiny_model("scripts-qwen35", architecture="qwen35")
    rollback.main([str(model), "--ctx", "256", "--context", "16", "--repeats", "1", "--threads", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [row.split("|")[1].strip() for row in rows] == [str(k) for k in rollback.DRAFT_LENGTHS]


def test_bench_engine_compares_every_method_with_the_target_alone(tiny_target, tiny_draft, capsys):
    engine.main(["--target", str(tiny_target), "--draft", str(tiny_draft), "--runs", "1", "--max-tokens", "6",
                 "--threads", "1", "--pass-context", "16", "--ctx", "2048"])
    out = capsys.readouterr().out
    assert "target pass ms by batch size after 16 tokens" in out
    rows = [line.split() for line in out.splitlines() if line.split(" ", 1)[0] in engine.PROMPTS]
    assert len(rows) == len(engine.PROMPTS) * len(engine.CONFIGS) and all(row[-1] == "True" for row in rows)


def test_bench_builds_pairs_two_builds_passes(tiny_target, capsys):
    this_build = Path(llama_cpp.__file__).parents[1]  # compared with itself: both workers start and answer
    builds.main(["--other", str(this_build), "--model", str(tiny_target), "--context", "16", "--rounds", "1",
                 "--reps", "1", "--threads", "1"])
    assert len(re.findall(r"tokens: other +\d+ ms, current", capsys.readouterr().out)) == len(builds.SIZES)


def test_bench_heads_prices_the_mtp_eagle3_and_dflash_heads(tmp_path, capsys):
    heads.main([str(tmp_path), "--layers", "4", "--embd", "64", "--vocab", "600", "--scales", "0.3",
                "--max-tokens", "6", "--eagle3", "--dflash", *SMALL])
    out = capsys.readouterr().out
    for source in ("mtp", "eagle3", "dflash"):
        assert f"{source} head measured on" in out
    assert out.count("break-even acceptance:") == 3 and "head step / one-token pass" in out


def test_bench_heads_extrapolates_the_mtp_head_to_more_layers(tmp_path, capsys):
    heads.main([str(tmp_path), "--layers", "4", "--embd", "64", "--vocab", "600", "--max-tokens", "6",
                "--extrapolate-to", "16", *SMALL])
    out = capsys.readouterr().out
    assert "EXTRAPOLATED to 16 layers (0.8b) from 4 and 8 layers" in out and "break-even acceptance" in out


def test_bench_moe_prices_a_moe_and_its_dense_twin(tmp_path, capsys):
    moe.main([str(tmp_path), "--quick", "--shapes", "qwen3-coder-30b-a3b", "--repeats", "1", *SMALL])
    out = capsys.readouterr().out
    assert out.count("acceptance 0.") == len(moe.ACCEPTANCES) and "dense twin" in out


@pytest.mark.skipif(shutil.which("tmux") is None, reason="the live view is measured in a tmux terminal")
def test_bench_tui_measures_the_live_view_in_a_terminal(tiny_target, capsys):
    tui.main(["--target", str(tiny_target), "--reps", "1", "-n", "6", "--threads", "1"])
    assert "median live/plain tok/s" in capsys.readouterr().out


def test_bench_server_compares_serve_with_run_and_serves_sessions(tiny_target, capsys):
    # Part 3's forced tool calls need a model that ends the JSON it is made to write: random weights do not.
    server.main(["--target", str(tiny_target), "--runs", "1", "--max-tokens", "6", "--turn-tokens", "6",
                 "--parts", "1,2,4", "--threads", "1", "--ctx", "16384"])
    out = capsys.readouterr().out
    assert "identical text in every run: True" in out
    assert "agent session, 4 turns" in out and "json_schema answers" in out


# -- scripts.replay and scripts.models -------------------------------------------------------------------------------
def test_replay_lookup_records_and_replays_every_slice(tiny_target, tmp_path, capsys):
    answers = tmp_path / "answers.json"
    lookup.main(["--record", str(answers), "--target", str(tiny_target), "--per-slice", "1", "--max-tokens", "12",
                 "--threads", "1"])
    slices = {answer["workload"] for answer in json.loads(answers.read_text())["answers"]}
    lookup.main([str(answers), "--max-tokens", "12"])
    rows = capsys.readouterr().out.splitlines()[-len(slices):]
    assert {row.split()[0] for row in rows} == slices


def test_replay_spread_puts_a_method_level_with_itself_on_a_quiet_machine(tiny_target, tmp_path, capsys):
    answers = tmp_path / "answers.json"
    lookup.main(["--record", str(answers), "--target", str(tiny_target), "--per-slice", "1", "--max-tokens", "12",
                 "--threads", "1"])
    slices = {answer["workload"] for answer in json.loads(answers.read_text())["answers"]}
    capsys.readouterr()
    # Without noise every run of a method against itself is even; with it, timing alone parts them.
    spread.main([str(answers), "--pairs", "lookup/lookup", "--seeds", "2", "--drift", "0", "--jitter", "0",
                 "--max-tokens", "12"])
    quiet = capsys.readouterr().out.splitlines()
    assert {row.split()[0] for row in quiet[-1 - len(slices):-1]} == slices
    assert all(row.split()[1:] == ["1.000", "0%", "1.000", "0%"] for row in quiet[-1 - len(slices):-1])
    assert quiet[-1].split() == ["every", "slice", "2/2", "runs", "2/2", "runs"]
    spread.main([str(answers), "--pairs", "lookup/lookup", "--seeds", "2", "--drift", "0.2", "--max-tokens", "12"])
    noisy = capsys.readouterr().out.splitlines()[-1 - len(slices):-1]
    assert any(row.split()[1] != "1.000" for row in noisy)


def test_replay_suffix_records_and_replays_agent_repeat(tiny_target, tmp_path, capsys):
    answers = tmp_path / "repeat.json"
    suffix.main(["--record", str(answers), "--target", str(tiny_target), "--threads", "1"])
    suffix.main([str(answers)])
    table = capsys.readouterr().out.split("from lookup\n")[1].splitlines()
    assert [row.split()[:2] for row in table] == [["cold", "yes"], ["warm", "yes"], ["cold", "no"], ["warm", "no"]]


def test_models_hybrid_writes_a_quantized_qwen35(tmp_path, capsys):
    path = tmp_path / "hybrid.gguf"
    hybrid.main([str(path), "--layers", "4", "--embd", "64", "--vocab", "600", "--type", "Q8_0"])
    assert capsys.readouterr().out.strip() == str(path)
    assert read_header(path)["general.architecture"] == "qwen35"


# -- scripts.record --------------------------------------------------------------------------------------------------
@pytest.mark.stock
@pytest.mark.skipif(any(shutil.which(tool) is None for tool in ("vim", "tmux", "curl")),
                    reason="llama.vim runs in vim, in a tmux terminal, and sends with curl")
@pytest.mark.skipif("LLAMA_VIM_GIT" not in os.environ,
                    reason="the plugin comes from GitHub, which CI cannot reach: set LLAMA_VIM_GIT to a clone")
def test_record_llama_vim_records_keystrokes_against_stock(make_tiny_model, stock_bin, tmp_path, capsys):  # noqa: F811
    model = make_tiny_model("fim-target", seed=0, logit_scale=8.0, **fim_fields())
    out = tmp_path / "llama-vim.jsonl"
    llama_vim.main(["--quick", "--out", str(out), "--model", str(model), "--llama-server",
                    str(stock_bin / "llama-server"), "--port", str(free_port()), "--plugin", os.environ["LLAMA_VIM_GIT"]])
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and all(line["client"].startswith("llama.vim ") for line in lines)
    assert {line["body"]["n_predict"] for line in lines if "body" in line} == {0, 128}  # warm-ups and completions
    assert "/infill requests" in capsys.readouterr().out


def test_record_llama_vscode_derives_the_committed_session_from_the_llama_vim_one(tmp_path):
    out = tmp_path / "llama-vscode.jsonl"
    llama_vscode.main(["--out", str(out)])
    assert out.read_text() == (REPO / "tests" / "data" / "editor-sessions" / "llama-vscode.jsonl").read_text()
