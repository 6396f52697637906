"""``localspec run`` end to end on tiny generated models, through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from typer.testing import CliRunner

from localspec.cli.app import app

runner = CliRunner()


def run_json(*args: str, input: str | None = None) -> dict:
    result = runner.invoke(app, ["run", "--json", "--threads", "1", *args], input=input)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_has_text_and_the_stats_object(tiny_target, tiny_draft):
    data = run_json("hello world", "--target", str(tiny_target), "--draft", str(tiny_draft), "--raw", "-n", "24")
    stats = data["stats"]
    assert stats["generated_tokens"] == 24
    assert {"acceptance_rate", "mean_accepted_length", "per_position_acceptance", "target_passes", "time_s",
            "decode_tok_per_s", "ttft_s", "drafted", "accepted"} <= stats.keys()
    assert isinstance(data["text"], str) and data["text"]


def test_every_method_prints_the_same_greedy_text(tiny_target, tiny_draft):
    texts = {
        method: run_json("the code print x", "--target", str(tiny_target), "--draft", str(tiny_draft),
                         "--method", method, "--temp", "0", "-n", "40")["text"]
        for method in ("none", "lookup", "draft", "hybrid", "auto")
    }
    assert len(set(texts.values())) == 1, texts


def test_prompt_from_stdin(tiny_target):
    assert run_json("--target", str(tiny_target), "--raw", "-n", "5", input="hello world")["stats"]["prompt_tokens"] > 1


def test_bad_input_is_one_line_with_the_fix(tiny_target, tmp_path):
    cases = [
        (["   "], "prompt is empty"),
        (["hi", "--method", "fastest"], "unknown --method"),
        (["hi", "--target", str(tmp_path / "missing.gguf")], "is not a file"),
        (["hi", "--draft", str(tiny_target)], "--draft needs --target"),
        (["hi", "--method", "draft"], "needs a draft model"),
    ]
    for args, message in cases:
        if "--target" not in args and "--draft" not in args:
            args = [*args, "--target", str(tiny_target)]
        result = runner.invoke(app, ["run", *args])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and "Traceback" not in result.output


def test_ctrl_c_stops_the_answer_and_exits_130(tiny_target):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "run", "hello", "--target", str(tiny_target), "--raw",
         "--ctx", "2048", "-n", "2000", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
    )
    proc.stdout.read(1)  # the answer has started
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert b"interrupted" in stderr and b"Traceback" not in stderr
