"""The measuring half of scripts/gpu_check: localspec offloaded to a GPU against stock llama.cpp, one report.

No real weights reach the GPU machine (it has no network), so the models are seeded-random at the real
shapes of what the profiles ship: speed depends on shapes and quantization, not on the values. Random
weights make random text, so acceptance here says nothing about real models; what the report measures is
what a pass costs, what a round costs beside its pass, and whether localspec's target alone keeps up with
stock llama-completion built from the same source on the same machine.

    python -m scripts.bench.gpu models DIR [--quick]            # float16 models, one process each
    python -m scripts.bench.gpu quantize DIR                    # Q4_K_M, as the profiles ship, by llama.cpp
    python -m scripts.bench.gpu report DIR --stock BINDIR --out OUT [--quick] [--cpu]

The report (printed, and OUT/report.md; the stock comparison's JSON in OUT/stock.json):
1. pass costs by batch size (1 ... 64 rows, every row's logits read, as verification needs) after 256 and
   4096 tokens for the 1.5B shape and after 256 for the 30B-A3B-shaped MoE (4 of its 48 layers);
2. per method (none, lookup, draft, auto): tok/s, agreement with target alone, and each round's time split
   into the target pass, drafting, and the rest (planning, acceptance, bookkeeping, rollback), beside a
   one-token pass; with a profile of where target-alone's own time goes;
3. ``localspec bench --vs-llama-cpp`` on the stock tools: target alone and each method against stock
   llama-completion, and stock's own speculative modes, same files, threads, prompts and offload.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

# On the lent H200's image a first model load after a numpy import segfaulted; importing localspec first
# loads what must come before numpy (engine/llama/library.py's load_native_libraries_first), here and in the bench
# process below. `models` runs while llama.cpp is still building, which that import allows.
import localspec  # noqa: F401
from scripts.bench.moe import SHAPES as MOE_SHAPES
from scripts.models.hybrid import vocabulary
from tests.tiny_models import TinySpec, quantize_tiny_model, write_tiny_model

LOCALSPEC = ("-m", "localspec")

QUANT = "Q4_K_M"  # what qwen-coder-1.5b ships for both models
# Qwen2.5-Coder 1.5B and 0.5B (llama.cpp's qwen2 graph is llama's plus attention biases), tied embeddings.
SHAPES = {
    "target-1.5b": TinySpec(
        architecture="llama", seed=0, n_layers=28, n_embd=1536, n_head=12, n_head_kv=2, head_dim=128, n_ff=8960,
        n_ctx=32768, tie_embeddings=True, f16=True, tokens=vocabulary(151936),
    ),
    "draft-0.5b": TinySpec(
        architecture="llama", seed=1, n_layers=24, n_embd=896, n_head=14, n_head_kv=2, head_dim=64, n_ff=4864,
        n_ctx=32768, tie_embeddings=True, f16=True, tokens=vocabulary(151936),
    ),
    # Qwen3-Coder-30B-A3B per layer; 4 of its 48 layers keep writing it to about a minute.
    "moe-30b-a3b": replace(MOE_SHAPES["qwen3-coder-30b-a3b"], n_layers=4),
}
# Small enough to write, quantize and measure on a 2-core CPU in a minute (K-quants need 256-wide rows).
QUICK = {
    "target-1.5b": replace(SHAPES["target-1.5b"], n_layers=2, n_embd=256, n_head=4, head_dim=64, n_ff=512,
                           tokens=vocabulary(4096)),
    "draft-0.5b": replace(SHAPES["draft-0.5b"], n_layers=2, n_embd=256, n_head=4, head_dim=64, n_ff=512,
                          tokens=vocabulary(4096)),
    "moe-30b-a3b": replace(SHAPES["moe-30b-a3b"], n_layers=1, n_embd=256, n_head=4, head_dim=64, n_expert=16,
                           n_ff_expert=256, n_ff=256, tokens=vocabulary(4096)),
}
PASS_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
METHODS = ("none", "lookup", "draft", "auto")
# The stock comparison's prompts: the first of each of these workloads (copying, writing, chatting).
STOCK_WORKLOADS = ("code-edit", "code-new", "chat")


def model_path(directory: Path, name: str, quant: str | None = None) -> Path:
    return directory / f"{name}-{quant or 'f16'}.gguf"


def _write(path: Path, spec: TinySpec) -> str:
    started = time.perf_counter()
    partial = path.with_suffix(".partial")  # never taken for a whole file if the writer dies
    write_tiny_model(partial, spec)
    partial.rename(path)
    return f"wrote {path.name} ({path.stat().st_size / 1e9:.1f} GB) in {time.perf_counter() - started:.0f} s"


def write_models(directory: Path, quick: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    shapes = QUICK if quick else SHAPES
    todo = {model_path(directory, name): spec for name, spec in shapes.items()
            if not model_path(directory, name).exists()}
    with ProcessPoolExecutor(max_workers=max(1, len(todo))) as pool:
        for line in pool.map(_write, todo, todo.values()):
            print(line, flush=True)


def quantize_models(directory: Path) -> None:
    """llama.cpp's own quantizer (through the binding, so the libraries this report measures), every core."""
    for name in SHAPES:
        source, path = model_path(directory, name), model_path(directory, name, QUANT)
        if path.exists() or not source.exists():
            continue
        started = time.perf_counter()
        partial = path.with_suffix(".partial")
        try:
            quantize_tiny_model(source, partial, QUANT, threads=0)
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from exc
        partial.rename(path)
        print(f"quantized {path.name} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - started:.0f} s",
              flush=True)


# -- the report ----------------------------------------------------------------------------------------------

class Report:
    """Markdown, printed as it grows (a run cut short still shows what it measured) and written at the end."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lines: list[str] = []

    def add(self, *lines: str) -> None:
        for line in lines:
            print(line, flush=True)
            self.lines.append(line)

    def table(self, header: list[str], rows: list[list[object]]) -> None:
        self.add("| " + " | ".join(header) + " |", "|" + "---|" * len(header))
        for row in rows:
            self.add("| " + " | ".join(str(cell) for cell in row) + " |")
        self.add("")

    def write(self) -> None:
        (self.out / "report.md").write_text("\n".join(self.lines) + "\n")


def machine_lines(cpu: bool) -> list[str]:
    from localspec.engine.llama.library import load_llama_cpp
    from localspec.engine.llama.machine import cpu_model

    gpu = "none (--cpu)"
    if not cpu:
        query = ["nvidia-smi", "--query-gpu=name,compute_cap,driver_version,memory.total", "--format=csv,noheader"]
        gpu = subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip() or "not found"
    system = load_llama_cpp().llama_print_system_info().decode()
    return [f"- GPU: {gpu}", f"- CPU: {cpu_model()}, {os.cpu_count()} cores", f"- llama.cpp: {system}"]


def pass_curves(report: Report, directory: Path, gpu_layers: int, threads: int, quick: bool, brief: bool) -> None:
    """Pass cost tables, by rows, relative to one row too."""
    from localspec.engine.llama.model import Model
    from scripts.bench.engine import pass_costs

    sizes = PASS_SIZES[:6] if quick else PASS_SIZES
    reps = 3 if quick else 9
    curves: dict[str, dict[int, float]] = {}
    for name, contexts in (("target-1.5b", (256,) if brief else (256, 4096)), ("moe-30b-a3b", (256,))):
        model = Model(model_path(directory, name, QUANT), n_ctx=4096 + 2 * max(sizes), n_threads=threads,
                           n_gpu_layers=gpu_layers)
        for context in contexts:
            costs, prefill = pass_costs(model, sizes=sizes, reps=reps, context=context)
            curves[f"{name} after {context}"] = costs
            report.add(f"- {name} after {context} tokens: prefill {prefill:.0f} tok/s, kernels {model.kernels}, "
                       f"{model.n_gpu_layers} GPU layers")
        del model
    report.add("")
    labels = list(curves)
    report.table(
        ["rows", *(f"{label}: ms" for label in labels), *(f"{label}: x one row" for label in labels)],
        [[size, *(f"{curves[label][size] * 1e3:.2f}" for label in labels),
          *(f"{curves[label][size] / curves[label][1]:.2f}" for label in labels)] for size in sizes],
    )


def method_rounds(report: Report, directory: Path, gpu_layers: int, threads: int, quick: bool, brief: bool) -> None:
    """Each method through the bench runner (interleaved runs, outputs compared token by token), with the
    time of its rounds split; then a profile of target-alone's rounds."""
    from localspec.bench.runner import BenchRunner, BenchSettings, Config
    from localspec.bench.workloads import BenchPrompt
    from localspec.session import ModelOptions, open_decoder, resolve_pair
    from scripts.bench.engine import PROMPTS, pass_costs

    pair = resolve_pair(target=model_path(directory, "target-1.5b", QUANT),
                        draft=model_path(directory, "draft-0.5b", QUANT))
    options = ModelOptions(n_ctx=4096, threads=threads, gpu_layers=gpu_layers, draft_gpu_layers=gpu_layers)
    decoder = open_decoder(pair, options, history=False)
    one_row_s = pass_costs(decoder.target, sizes=(1,), reps=15)[0][1]  # after 256 tokens: the yardstick
    prompts = [BenchPrompt(name, name, (text,)) for name, text in PROMPTS.items()][: 1 if quick else None]
    max_tokens = 32 if quick else 128 if brief else 256
    settings = BenchSettings([Config(m) for m in METHODS], runs=1 if quick or brief else 3, max_tokens=max_tokens)
    result = BenchRunner(decoder, settings).run(prompts)
    rows = []
    for config in settings.configs:
        runs = [m for r in result.records if r.config == config for m in r.runs]
        stats = [m.stats for m in runs]
        rounds = sum(s.target_passes for s in stats)
        tokens = sum(s.generated_tokens for s in stats)
        per_round = {part: 1e3 * sum(getattr(s, f"{part}_s") for s in stats) / rounds
                     for part in ("verify", "draft", "overhead", "rollback")}
        own = per_round["overhead"] + per_round["rollback"] + (per_round["draft"] if config.method != "draft" else 0)
        identical = all(r.difference is None for r in result.records if r.config == config)
        rows.append([
            config.label, f"{tokens / sum(s.decode_s for s in stats):.1f}", identical,
            f"{sum(s.accepted for s in stats)}/{sum(s.drafted for s in stats)}", f"{tokens / rounds:.2f}",
            *(f"{per_round[p]:.3f}" for p in ("verify", "draft", "overhead", "rollback")),
            f"{own / (one_row_s * 1e3):.1%}",
        ])
    report.add(f"{len(prompts)} prompt(s) x {settings.runs} run(s), {max_tokens} tokens, greedy; ms per round; "
               f"'own work' is the round's time outside target and draft-model passes, against a one-row pass "
               f"({one_row_s * 1e3:.2f} ms after 256 tokens)", "")
    report.table(["method", "tok/s", "same tokens as none", "accepted/drafted", "tokens/round", "pass",
                  "drafting", "plan+accept+record", "rollback", "own work / one-row pass"], rows)

    # The wall clock over target alone's rounds, against the rounds' own sum that the tables report: what
    # the generator does between rounds is in the first only.
    alone = decoder.sibling(method="none", draft_len=None, history=None, own_caches=False)
    prompt = decoder.target.tokenize(next(iter(PROMPTS.values())), add_bos=True)
    steps = alone.generate(prompt, max_tokens=max_tokens)
    next(steps)  # the prefill and the first token
    started = time.perf_counter()
    tokens = 1 + sum(len(step.tokens) for step in steps)
    wall = time.perf_counter() - started
    report.add(f"target alone, wall clock after the first token: {(tokens - 1) / wall:.1f} tok/s; the rounds' own "
               f"sum: {alone.stats.decode_tok_per_s:.1f} tok/s ({tokens} tokens)", "")

    # Where target-alone's own time goes (a profile inflates Python-heavy parts, so read it for shares).
    profile = cProfile.Profile()
    profile.enable()
    for _ in alone.generate(prompt, max_tokens=max_tokens):
        pass
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(14)
    report.add("target alone under cProfile, by own time:", "```", *_profile_lines(text.getvalue()), "```", "")


def _profile_lines(text: str) -> list[str]:
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip().startswith("ncalls")), 0)
    return [line.rstrip() for line in lines[start:] if line.strip()]


def stock_comparison(report: Report, directory: Path, stock: Path, out: Path, gpu_layers: int, threads: int,
                     quick: bool, brief: bool) -> None:
    """``localspec bench --vs-llama-cpp`` in its own process (its kernel choice is process-wide)."""
    from localspec.bench.stock import overall_rows
    from localspec.bench.workloads import SHIPPED_DIR

    # The prompts beside the models: a lent machine sends back at most 8 files from OUT.
    json_path, prompts = out / "stock.json", directory / "stock-prompts.jsonl"
    # The first prompt of each workload: every stock run is a process that loads its model again.
    prompts.write_text("".join((SHIPPED_DIR / f"{name}.jsonl").read_text().splitlines(keepends=True)[0]
                               for name in STOCK_WORKLOADS[: 1 if quick else None]))
    command = [
        sys.executable, *LOCALSPEC, "bench", "--vs-llama-cpp", str(stock),
        "--target", str(model_path(directory, "target-1.5b", QUANT)),
        "--draft", str(model_path(directory, "draft-0.5b", QUANT)),
        "--prompts", str(prompts), "--methods", ",".join(m for m in METHODS if not brief or m != "draft"),
        "--runs", "1" if quick or brief else "2", "-n", "32" if quick else "128" if brief else "256",
        "--gpu-layers", str(gpu_layers), "--draft-gpu-layers", str(gpu_layers), "--threads", str(threads),
        "--ctx", "4096", "--no-history", "--json", str(json_path),
    ]
    report.add(f"`localspec {' '.join(command[1 + len(LOCALSPEC):])}`", "")
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ | {"COLUMNS": "220"}, check=False)
    if done.returncode != 0:
        report.add(f"failed (exit {done.returncode}):", "```", *done.stderr.strip().splitlines()[-15:], "```")
        return
    report.add("```", *done.stdout.rstrip().splitlines(), "```", f"({time.perf_counter() - started:.0f} s)", "")
    for row in overall_rows(json.loads(json_path.read_text())["rows"]):
        report.add(f"- {row['engine']}: {row['decode_tok_per_s']} tok/s decode, {row['decode_ratio']}x stock "
                   f"llama-completion's decode, identical: {row['identical']}")
    report.add("")


def write_report(args: argparse.Namespace) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    report = Report(args.out)
    gpu_layers = 0 if args.cpu else -1
    threads = args.threads or min(4, os.cpu_count() or 1)
    started = time.perf_counter()
    report.add("# localspec GPU check", "", *machine_lines(args.cpu), f"- threads {threads}, GPU layers "
               f"{'all' if gpu_layers < 0 else gpu_layers}; models seeded-random at the shipped shapes, {QUANT}", "")
    # Most telling first: a run cut short by a lent machine's time limit keeps what it printed.
    report.add("## Against stock llama.cpp (same source, unpatched, built beside it)", "")
    stock_comparison(report, args.models, args.stock, args.out, gpu_layers, threads, args.quick, args.brief)
    report.add("## Methods, and a round's time split", "")
    method_rounds(report, args.models, gpu_layers, threads, args.quick, args.brief)
    report.add("## Pass costs by rows (every row's logits read)", "")
    pass_curves(report, args.models, gpu_layers, threads, args.quick, args.brief)
    report.add(f"(report took {time.perf_counter() - started:.0f} s)")
    report.write()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    models = commands.add_parser("models", help="write the float16 models")
    models.add_argument("models", type=Path)
    models.add_argument("--quick", action="store_true", help="small shapes, for a CPU")
    quantize = commands.add_parser("quantize", help=f"quantize them to {QUANT}")
    quantize.add_argument("models", type=Path)
    measure = commands.add_parser("report", help="measure and write the report")
    measure.add_argument("models", type=Path)
    measure.add_argument("--stock", type=Path, required=True, help="stock llama.cpp's bin folder")
    measure.add_argument("--out", type=Path, required=True)
    measure.add_argument("--threads", type=int)
    measure.add_argument("--quick", action="store_true", help="fewer sizes, prompts and tokens")
    measure.add_argument("--cpu", action="store_true", help="nothing offloaded (a CPU-only build)")
    measure.add_argument("--brief", action="store_true",
                         help="one run, 128 tokens, no draft model against stock, no 4096-token curve")
    args = parser.parse_args(argv)
    if args.command == "models":
        write_models(args.models, args.quick)
    elif args.command == "quantize":
        quantize_models(args.models)
    else:
        write_report(args)


if __name__ == "__main__":
    main()
