"""Decode speed of each method vs the target alone, measured in one run on the real default pair.

Prints, per prompt and method: decode tok/s, the ratio to the target alone (same prompt, same run,
methods interleaved so machine drift cancels), acceptance, target passes, Python overhead per round,
and whether the output is token-identical to the target alone. Greedy, --threads 2 by default.
First it prints the target's pass time by batch size and its prefill speed: what verification costs.
``--pass-context N`` times those passes after N tokens of context instead of 256 (attention grows with it),
``--pass-costs-only`` stops there, and ``--fast`` runs stock kernels instead of exact ones (the choice is
process-wide, so compare the two in two runs). ``--target``/``--draft`` measure other GGUF files:

    .venv/bin/python -m scripts.bench.engine [--runs 2] [--max-tokens 192] [--threads 2]
    .venv/bin/python -m scripts.bench.engine --pass-costs-only --pass-context 3000 [--fast]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from localspec.bench import report
from localspec.bench.runner import BenchRunner, BenchSettings, Config
from localspec.bench.workloads import BenchPrompt
from localspec.engine.llama.model import Model
from localspec.session import ModelOptions, open_decoder, resolve_pair

EDIT_CODE = '''def parse_config(path):
    settings = {}
    with open(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"line {number}: expected key = value")
            key, value = line.split("=", 1)
            key = key.strip()
            value = value.strip()
            if value.lower() in ("true", "false"):
                value = value.lower() == "true"
            elif value.isdigit():
                value = int(value)
            settings[key] = value
    return settings


def merge_configs(base, override):
    merged = dict(base)
    for key, value in override.items():
        if key in merged and isinstance(merged[key], dict) and isinstance(value, dict):
            merged[key] = merge_configs(merged[key], value)
        else:
            merged[key] = value
    return merged
'''

PROMPTS = {
    "code-edit": "Here is some Python code:\n\n```python\n" + EDIT_CODE + "```\n\n"
    "Return the complete code with one change: rename `settings` to `options` everywhere. "
    "Output only the code.",
    "code-new": "Write a Python class implementing an LRU cache with a per-entry time-to-live, "
    "with get, put and delete methods and docstrings.",
}
CONFIGS = [Config("none"), Config("lookup"), Config("draft", 3), Config("hybrid"), Config("auto")]
# Pass costs are timed after this many tokens of context, at these batch sizes.
PASS_CONTEXT = 256
PASS_SIZES = (1, 2, 4, 8, 16, 32, 64)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--pass-context", type=int, default=PASS_CONTEXT)
    parser.add_argument("--pass-costs-only", action="store_true")
    parser.add_argument("--fast", action="store_true", help="stock kernels instead of exact ones")
    parser.add_argument("--target", type=Path, help="this GGUF file instead of the default profile's target")
    parser.add_argument("--draft", type=Path, help="with --target: the draft model (the draft method needs one)")
    args = parser.parse_args(argv)

    pair = resolve_pair(target=args.target, draft=args.draft)  # neither: the default profile's pair
    n_ctx = max(args.ctx, args.pass_context + 2 * max(PASS_SIZES))
    decoder = open_decoder(pair, ModelOptions(n_ctx=n_ctx, threads=args.threads, exact=False if args.fast else None))
    print_pass_costs(decoder.target, args.pass_context)
    if args.pass_costs_only:
        return

    # The bench runner warms up, interleaves the methods per run and compares outputs token by token.
    prompts = [BenchPrompt(name, name, (prompt,)) for name, prompt in PROMPTS.items()]
    settings = BenchSettings(CONFIGS, runs=args.runs, max_tokens=args.max_tokens)
    result = BenchRunner(decoder, settings, progress=lambda what, done, total: print(what, flush=True)).run(prompts)

    print(f"\n{'prompt':10} {'method':8} {'tok/s':>7} {'vs none':>8} {'accept':>7} {'passes':>7} "
          f"{'ovh ms/round':>12} {'identical':>9}")
    for row in report.build_rows(result):
        runs = [m.stats for r in result.records if r.prompt.workload == row["workload"] and r.config.label ==
                report.row_label(row) for m in r.runs]
        overhead = 1000 * statistics.median(s.overhead_s / max(1, s.target_passes) for s in runs)
        print(f"{row['workload']:10} {row['method']:8} {row['tok_per_s']:7.1f} {row['speedup'] or 0:7.2f}x "
              f"{row['acceptance_rate']:7.0%} {row['target_passes']:7.0f} {overhead:12.2f} {row['identical']!s:>9}")


def long_prompt(target: Model, length: int) -> list[int]:
    """At least ``length`` tokens of code, repeated."""
    tokens = target.tokenize(EDIT_CODE, add_bos=False)
    return tokens * (length // len(tokens) + 1)


def pass_seconds(target: Model, tokens: list[int], context: int, size: int, reps: int) -> float:
    """Median seconds of ``reps`` passes over ``tokens[context:context + size]`` (all rows' logits, as
    verification needs), each after rolling the cache back to the ``context``-token prefix."""
    times = []
    for _ in range(reps):
        target.rollback(context)
        start = time.perf_counter()
        target.eval(tokens[context : context + size], n_logits=size)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def pass_costs(target: Model, sizes=PASS_SIZES, reps=5, context=PASS_CONTEXT) -> tuple[dict[int, float], float]:
    """Median target pass seconds by batch size after a ``context``-token prefix, and the prefill speed of
    that prefix in tokens per second."""
    tokens = long_prompt(target, context + max(sizes))
    target.reset()
    start = time.perf_counter()
    target.eval(tokens[:context], n_logits=0, prefill=True)
    prefill = context / (time.perf_counter() - start)
    costs = {size: pass_seconds(target, tokens, context, size, reps) for size in sizes}
    target.reset()
    return costs, prefill


def print_pass_costs(target: Model, context: int = PASS_CONTEXT) -> None:
    costs, prefill = pass_costs(target, context=context)
    shown = " / ".join(f"{size}: {1000 * seconds:.0f}" for size, seconds in costs.items())
    print(f"target pass ms by batch size after {context} tokens ({target.kernels} kernels): {shown}; "
          f"prefill {prefill:.0f} tok/s", flush=True)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\n(total {time.perf_counter() - start:.0f} s)")
