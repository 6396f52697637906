"""Table commands in a pipe (`localspec check A B | cat`, a log file, CI output): no line is wider than
PIPE_WIDTH, tables shrink and wrap their prose, and nothing is cut off."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console
from typer.testing import CliRunner

from localspec import paths
from localspec.cli.app import app
from localspec.cli.bench import _table
from localspec.cli.console import PIPE_WIDTH
from localspec.engine.persist.history import HistoryStore
from localspec.profiles import DEFAULT_PROFILE


def piped(*args) -> str:
    """stdout and stderr of a command run as in a pipe (CliRunner's streams are no terminal)."""
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code in (0, 1), result.output
    return result.stdout + result.stderr


def assert_fits(text: str) -> None:
    too_wide = [line for line in text.splitlines() if len(line) > PIPE_WIDTH]
    assert not too_wide, f"{len(too_wide)} line(s) over {PIPE_WIDTH} characters, e.g. {too_wide[0]!r}"
    assert "…" not in text  # wrapped, never cut


@pytest.fixture
def deep_home(tmp_path, monkeypatch):
    """A LOCALSPEC_HOME whose paths alone are wider than a pipe's lines."""
    home = tmp_path / ("a-rather-long-folder-name-" * 3) / ("and-another-one-below-it-" * 3)
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    return home


def test_check_wraps_a_long_finding_inside_the_table(tiny_target, make_tiny_model):
    # A hybrid draft: the memory finding is a paragraph of prose (over 400 characters on one line before).
    text = piped("check", tiny_target, make_tiny_model("pipes-hybrid", architecture="qwen35", n_head_kv=2))
    assert_fits(text)
    assert "memory" in text


def test_profiles_and_profile_show(deep_home):
    listing = piped("profiles")
    assert_fits(listing)
    assert "Qwen2.5-Coder 32B Instruct + 0.5B draft" in " ".join(listing.split())
    profiles = json.loads(piped("profiles", "--json"))
    assert [p["name"] for p in profiles if p["default"]] == [DEFAULT_PROFILE]
    shown = piped("profiles", "show", DEFAULT_PROFILE)
    assert_fits(shown)
    assert "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046" in shown


def test_doctor(deep_home):
    text = piped("doctor")
    assert_fits(text)
    assert "llama.cpp build:" in text


def test_history(deep_home):
    paths.history_dir().mkdir(parents=True)
    history = HistoryStore(paths.history_file("0123456789abcdef"))
    history.add([1, 2, 3, 4], [5, 6, 7, 8, 9])
    history.save()
    text = piped("history")
    assert_fits(text)
    assert "0123456789abcdef" in text
    data = json.loads(piped("history", "--json"))
    assert data["files"] == [{"tokenizer": "0123456789abcdef", "answers": 1, "tokens": 9, "bytes": data["files"][0]["bytes"]}]


def test_bench_tables_and_notes(tiny_target, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"workload": "echo", "prompt": "hello world the code print x = hello world"}) + "\n")
    text = piped("bench", "--target", tiny_target, "--prompts", prompts, "--methods", "none,lookup,auto",
                 "--runs", 1, "--max-tokens", 8, "--ctx", 512)
    assert_fits(text)
    assert "recommended for echo" in text and "overall:" in text


def test_bench_table_fits_a_pipe_with_a_tiny_models_six_figure_rates():
    # CI's fast CPU ran the tiny model's `none` at over 100000 tok/s: one more digit pushed a line past PIPE_WIDTH.
    row = {"prompts": 1, "runs": 1, "baseline_tok_per_s": 123456.7, "tok_per_s": 123456.7, "speedup": 1.0,
           "expected_speedup": 1.0, "acceptance_rate": 0.0, "mean_accepted_length": 1.0, "per_position_acceptance": [],
           "target_passes": 8, "ttft_s": 0.0, "identical": True, "method": "none", "draft_len": None, "history": False}
    rows = [row, row | {"method": "lookup", "draft_len": "auto", "per_position_acceptance": [1.0, 0.5, 0.33, 0.25]},
            row | {"method": "auto", "draft_len": "auto", "history": True}]
    screen = Console(file=io.StringIO(), width=PIPE_WIDTH, soft_wrap=True)  # as `out`: nothing cropped
    screen.print(_table("echo", rows))
    assert_fits(screen.file.getvalue())
    assert "123456.7" in screen.file.getvalue() and "0.33 0.25" in screen.file.getvalue()
