"""The header-only memory table (gguf/memory.py) against what llama.cpp itself reports once loaded."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localspec.cli.app import app
from localspec.engine.llama.model import Model
from localspec.gguf.memory import SNAPSHOT_ARCHITECTURES, memory_kind, speculation_note


@pytest.mark.parametrize("arch", ["llama", "qwen35", "lfm2", "mamba"])
def test_the_table_agrees_with_llama_cpp(make_tiny_model, arch):
    path = make_tiny_model(f"memory-{arch}", architecture=arch)
    plan = Model(path, n_ctx=128, n_threads=1, rollback_snapshots=4).memory_plan
    assert plan.memory == memory_kind(arch)
    assert (plan.snapshots > 0) == (arch in SNAPSHOT_ARCHITECTURES)


def test_check_names_each_models_memory(make_tiny_model):
    target = make_tiny_model("memory-qwen35", architecture="qwen35")
    draft = make_tiny_model("memory-mamba", architecture="mamba")
    result = CliRunner().invoke(app, ["check", str(target), str(draft), "--json"])
    finding = next(f for f in json.loads(result.stdout)["findings"] if f["code"] == "memory")
    assert finding["severity"] == "ok"
    assert f"target {speculation_note('qwen35')}" in finding["detail"]
    assert "draft mamba: recurrent (recurrent state, no snapshots" in finding["detail"]
