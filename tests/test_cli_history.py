"""``localspec history``: answers of run sessions are kept per tokenizer, listed, opted out of and cleared."""

from __future__ import annotations

import stat

from typer.testing import CliRunner

from localspec import paths
from localspec.cli.app import app


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def answers_listed() -> str:
    result = run("history")
    assert result.exit_code == 0, result.output
    return result.output


def test_runs_add_answers_no_history_does_not_and_clear_empties_it(tiny_target):
    assert "empty" in answers_listed()
    generate = ("run", "hello world", "--target", str(tiny_target), "--max-tokens", "6")
    assert run(*generate).exit_code == 0
    [stored] = paths.history_dir().glob("*.bin")
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stored.stem in answers_listed()
    before = stored.read_bytes()
    assert run(*generate, "--no-history").exit_code == 0
    assert stored.read_bytes() == before
    assert run(*generate).exit_code == 0
    assert len(stored.read_bytes()) > len(before)

    result = run("history", "clear")
    assert result.exit_code == 0 and "cleared 1 history file" in result.output
    assert not stored.exists()
    assert "empty" in answers_listed()


def test_help_names_the_opt_out():
    result = CliRunner().invoke(app, ["run", "--help"], terminal_width=200)
    assert "--no-history" in result.output
    assert run("history", "clear", "--help").exit_code == 0
