"""Replays `auto`'s decisions on recorded greedy answers, to tune the drafters and the planner.

Prints, per slice, the speedup over target alone the recorded pass costs imply and the acceptance, for
`auto` (no draft model, no answer history), for `--method lookup`, and for stock llama.cpp's ngram-simple
(a 12-token match drafts the 48 tokens that followed it) replayed the same way. How answers are recorded
and replayed: recording.py.

    .venv/bin/python -m scripts.replay.lookup --record /tmp/replay/answers.json [--target FILE]  # 5 min alone
    .venv/bin/python -m scripts.replay.lookup /tmp/replay/answers.json [--max-tokens 96]

``--record`` also serves scripts/replay/suffix.py, for the agent-repeat slice.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

from scripts.replay.recording import RECORD_TOKENS, Replay, record


def ngram_simple(history: list[int], n: int = 12, m: int = 48) -> list[int]:
    """llama.cpp's ngram-simple: the m tokens after the latest earlier occurrence of the last n."""
    pattern = history[-n:]
    for start in range(len(history) - n - 1, 0, -1):
        if history[start : start + n] == pattern:
            copy = history[start + n : start + n + m]
            return copy if len(copy) >= n else []
    return []


def ngram_simple_replay(answer: dict, max_tokens: int, cost: Callable[[int], float]) -> tuple[float, int, int]:
    """Stock llama.cpp's ngram-simple on one answer: (speedup over target alone, drafted, accepted)."""
    history = list(answer["prompt"]) + answer["answer"][:1]  # the prefill gives the first token
    target = answer["answer"][:max_tokens]
    seconds, drafted, accepted, position = 0.0, 0, 0, 1
    while position < len(target):
        draft = ngram_simple(history)[: len(target) - position - 1]
        hits = 0
        while hits < len(draft) and draft[hits] == target[position + hits]:
            hits += 1
        seconds += cost(len(draft) + 1)
        step = target[position : position + hits + 1]
        history += step
        position += len(step)
        drafted += len(draft)
        accepted += hits
    return cost(1) * (len(target) - 1) / seconds, drafted, accepted


def report(path: str, max_tokens: int) -> None:
    replay = Replay.load(path)
    decoders = {method: replay.decoder(method) for method in ("auto", "lookup")}
    print(f"{'slice':14} {'auto':>6} {'accepted':>9} {'lookup':>7} {'accepted':>9} {'ngram-simple':>13} {'accepted':>9}")
    for workload in dict.fromkeys(a["workload"] for a in replay.answers):
        cells = []
        for engine in ("auto", "lookup", "ngram-simple"):
            speedups, drafted, accepted = [], 0, 0
            for answer in (a for a in replay.answers if a["workload"] == workload):
                if engine == "ngram-simple":
                    speedup, d, a = ngram_simple_replay(answer, max_tokens, replay.cost)
                else:
                    speedup, d, a = replay.run(decoders[engine], answer, max_tokens)
                speedups.append(speedup)
                drafted, accepted = drafted + d, accepted + a
            mean = math.exp(sum(map(math.log, speedups)) / len(speedups))
            cells.append(f"{mean:5.2f}x {accepted / max(1, drafted):8.0%}")
        print(f"{workload:14} {cells[0]:>16} {cells[1]:>17} {cells[2]:>23}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answers", nargs="?", help="a file written by --record")
    parser.add_argument("--record", metavar="FILE", help="record the target's greedy answers and pass costs")
    parser.add_argument("--max-tokens", type=int, default=RECORD_TOKENS)
    parser.add_argument("--threads", type=int, help="recording: target threads (default: the machine's)")
    parser.add_argument("--per-slice", type=int, help="recording: prompts per slice (default: all)")
    parser.add_argument("--pass-costs", metavar="FILE", help="recording: pass seconds by batch size, not measured")
    parser.add_argument("--target", type=Path, help="recording: this GGUF file (default: the default profile's)")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record, max_tokens=args.max_tokens, threads=args.threads, per_slice=args.per_slice,
               costs_file=args.pass_costs, target=args.target)
    elif args.answers:
        report(args.answers, args.max_tokens)
    else:
        parser.error("give a recorded answers file, or --record FILE")


if __name__ == "__main__":
    main()
