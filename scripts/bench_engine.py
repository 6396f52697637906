#!/usr/bin/env python3
"""Decode speed of each method vs the target alone, measured in one run on the real default pair.

Prints, per prompt and method: decode tok/s, the ratio to the target alone (same prompt, same run,
methods interleaved so machine drift cancels), acceptance, target passes, Python overhead per round,
and whether the output is token-identical to the target alone. Greedy, --threads 2 by default.
First it prints the target's pass time by batch size and its prefill speed: what verification costs.

    .venv/bin/python scripts/bench_engine.py [--runs 2] [--max-tokens 192] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

from localspec import store
from localspec.conversation import Conversation
from localspec.engine.backend import LlamaModel
from localspec.engine.decoder import SpeculativeDecoder
from localspec.engine.proposers import DraftModelProposer
from localspec.profiles import DEFAULT_PROFILE, load_profile

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
METHODS = [("none", None), ("lookup", None), ("draft", 3), ("hybrid", None), ("auto", None)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=4096)
    args = parser.parse_args()

    profile = load_profile(DEFAULT_PROFILE)
    target_path, draft_path = store.resolve_model(profile.target), store.resolve_model(profile.draft)
    target = LlamaModel(target_path, n_ctx=args.ctx, n_threads=args.threads)
    draft = DraftModelProposer(lambda: LlamaModel(draft_path, n_ctx=args.ctx, n_threads=args.threads))
    ratio = draft_path.stat().st_size / target_path.stat().st_size

    def generate(prompt: str, method: str, draft_len: int | None):
        # A fresh controller per run: nothing learned on one method leaks into another.
        decoder = SpeculativeDecoder(target, draft=draft, method=method, draft_len=draft_len, draft_cost_ratio=ratio)
        conversation = Conversation(decoder)
        text_tokens = []
        for piece in conversation.ask(prompt, max_tokens=args.max_tokens):
            text_tokens.append(piece.text)
        return decoder.stats, decoder.target.tokens[-decoder.stats.generated_tokens + 1 :]

    # Untimed warm-up of both models.
    generate("Say hi.", "draft", 2)
    print_pass_costs(target)

    results: dict[tuple[str, str], list] = {}
    outputs: dict[tuple[str, str], list[int]] = {}
    for run in range(args.runs):
        for name, prompt in PROMPTS.items():
            for method, k in METHODS:
                stats, tokens = generate(prompt, method, k)
                results.setdefault((name, method), []).append(stats)
                outputs.setdefault((name, method), tokens)
                print(f"run {run} {name:9} {method:7} {stats.decode_tok_per_s:6.1f} tok/s", flush=True)

    print(f"\n{'prompt':10} {'method':8} {'tok/s':>7} {'vs none':>8} {'accept':>7} {'passes':>7} "
          f"{'ovh ms/round':>12} {'identical':>9}")
    for name in PROMPTS:
        base = statistics.median(s.decode_tok_per_s for s in results[(name, "none")])
        for method, _ in METHODS:
            runs = results[(name, method)]
            tps = statistics.median(s.decode_tok_per_s for s in runs)
            last = runs[-1]
            overhead = 1000 * statistics.median(s.overhead_s / max(1, s.rounds) for s in runs)
            same = outputs[(name, method)] == outputs[(name, "none")]
            print(f"{name:10} {method:8} {tps:7.1f} {tps / base:7.2f}x {last.acceptance_rate:7.0%} "
                  f"{last.rounds:7d} {overhead:12.2f} {str(same):>9}")


def print_pass_costs(target: LlamaModel, sizes=(1, 2, 4, 8, 16, 32, 64), reps=5) -> None:
    """Median target pass time by batch size (all rows' logits, as verification needs), and prefill speed."""
    tokens = target.tokenize(EDIT_CODE * 3, add_bos=False)
    target.reset()
    start = time.perf_counter()
    target.eval(tokens[:256], n_logits=0)
    prefill = 256 / (time.perf_counter() - start)
    costs = []
    for size in sizes:
        times = []
        for _ in range(reps):
            target.rollback(256)
            start = time.perf_counter()
            target.eval(tokens[256 : 256 + size], n_logits=size)
            times.append(time.perf_counter() - start)
        costs.append(f"{size}: {1000 * statistics.median(times):.0f}")
    target.reset()
    print(f"target pass ms by batch size: {' / '.join(costs)}; prefill {prefill:.0f} tok/s", flush=True)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\n(total {time.perf_counter() - start:.0f} s)")
