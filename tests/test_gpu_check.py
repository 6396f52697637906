"""scripts/gpu_check's measuring half (scripts/bench/gpu.py), run here on a CPU at small shapes: a lent GPU
gets about 15 minutes in a session, so every step it runs after the CUDA build must have run here first."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_bench_stock import stock_bin  # noqa: F401  (the fixture: stock tools, or a skip)

REPO = Path(__file__).resolve().parents[1]


def bench_gpu(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "scripts.bench.gpu", *args],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.stock
def test_report_measures_every_part_on_quick_models(tmp_path, stock_bin):  # noqa: F811
    models, out = tmp_path / "models", tmp_path / "out"
    written = bench_gpu("models", str(models), "--quick")
    assert written.count("wrote ") == 3
    bench_gpu("quantize", str(models))
    assert sorted(p.name for p in models.glob("*-Q4_K_M.gguf")) == [
        "draft-0.5b-Q4_K_M.gguf", "moe-30b-a3b-Q4_K_M.gguf", "target-1.5b-Q4_K_M.gguf"
    ]
    assert not list(models.glob("*.partial"))
    bench_gpu("report", str(models), "--stock", str(stock_bin), "--out", str(out), "--quick", "--cpu", "--threads", "2")
    report = (out / "report.md").read_text()

    # Pass costs: a row per size, positive times, the one-row column relative to itself.
    curve = [line for line in report.splitlines() if re.match(r"\| (1|2|3|4|6|8) \|", line)]
    assert [line.split("|")[1].strip() for line in curve] == ["1", "2", "3", "4", "6", "8"]
    cells = curve[0].strip("|").split("|")
    assert all(float(c) > 0 for c in cells[1:4]) and all(c.strip() == "1.00" for c in cells[4:])

    # Every method measured; on a patched CPU build each one's tokens equal target alone's.
    for method in ("none", "lookup", "draft", "auto"):
        row = next(line for line in report.splitlines() if re.match(rf"\| {method}( k=auto)? \|", line))
        assert row.split("|")[3].strip() == "True", row
        assert float(row.split("|")[-2].strip().rstrip("%")) >= 0
    assert "target alone under cProfile" in report and "tottime" in report

    # The stock comparison ran and its JSON holds stock llama-completion and localspec's target alone.
    assert "failed (exit" not in report
    assert re.search(r"- localspec none: [\d.]+ tok/s decode, [\d.]+x stock llama-completion", report)
    assert (out / "stock.json").is_file()


def test_importing_localspec_loads_a_cpu_build_only_when_a_model_needs_it():
    # A GPU build is loaded on import, before numpy (engine/llama/library.py's load_native_libraries_first); a CPU
    # build is not, so commands that load no model start as fast as before.
    done = subprocess.run([sys.executable, "-c", "import localspec, sys; print('llama_cpp' in sys.modules)"],
                          capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the GNU C++ runtime is Linux's")
def test_importing_localspec_puts_the_cxx_runtime_in_the_global_namespace_before_numpy():
    # On the lent machines' image a CPU build's first model load segfaulted once numpy was imported, and ran
    # with the C++ runtime loaded globally first (tried there both ways). The global namespace is what
    # dlsym(RTLD_DEFAULT) searches: a symbol of libstdc++ must be found there, with numpy not yet imported.
    code = "import ctypes, localspec, sys; print('numpy' in sys.modules, hasattr(ctypes.CDLL(None), '_ZNSt6localeC1Ev'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert done.stdout.split() == ["False", "True"]
