"""How far apart one `localspec bench --quick` run can put two methods, from timing noise and from the
decisions that noise sways: recorded answers replayed in bench's order, many times, on noisy pass times.

Each seed is one bench run: one decoder per method kept across the slices, sharing their pass costs and
advanced in lockstep (as bench keeps and runs them), each answer timed on a machine whose speed strays from
the recording's per answer (``--drift``) and per pass (``--jitter``), for each decoder apart. Per slice it
prints the 10th percentile of the first method's speed over the second's and how often that ratio falls
below ``--bar``, twice: as timed (what bench would print), and on the passes' recorded seconds (the spread
that comes from different decisions alone: measured costs that strayed chose other draft lengths). A method
against itself (``auto/auto``) is the floor a one-run criterion has to clear.

    .venv/bin/python -m scripts.replay.lookup --record /tmp/replay/quick.json --per-slice 1 --max-tokens 96
    .venv/bin/python -m scripts.replay.spread /tmp/replay/quick.json [--pairs auto/auto,auto/lookup] [--seeds 30]
"""

from __future__ import annotations

import argparse
import math
import random

import numpy as np

from scripts.replay.recording import Replay

QUICK_TOKENS = 96  # what bench --quick answers


class StrayingMachine:
    """A pass-time factor: the answer's speed (re-drawn by ``next_answer``) times a per-pass jitter."""

    def __init__(self, rng: random.Random, drift: float, jitter: float) -> None:
        self.rng, self.drift, self.jitter = rng, drift, jitter
        self.speed = 1.0

    def next_answer(self) -> None:
        self.speed = math.exp(self.rng.gauss(0.0, self.drift))

    def __call__(self) -> float:
        return self.speed * math.exp(self.rng.gauss(0.0, self.jitter))


def one_run(replay: Replay, methods: tuple[str, str], seed: int, args) -> dict[str, tuple[float, float]]:
    """Per slice: (timed ratio, ratio on recorded seconds) of the first method's speed over the second's."""
    machines = [StrayingMachine(random.Random(f"{seed}/{i}"), args.drift, args.jitter) for i in range(2)]
    first = replay.decoder(methods[0], noise=machines[0])
    decoders = [first, replay.decoder(methods[1], noise=machines[1], costs=first.controller.costs)]
    ratios = {}
    for answer in replay.answers:
        for machine in machines:
            machine.next_answer()
        recorded = [decoder.target.recorded_s for decoder in decoders]
        speedups = [speedup for speedup, _, _ in replay.run_together(decoders, answer, args.max_tokens)]
        # Both decoders emit the same tokens, so their speeds compare as their speedups, or their seconds inverted.
        (timed, timed_other) = speedups
        seconds, seconds_other = (decoder.target.recorded_s - before for decoder, before in zip(decoders, recorded))
        ratios[answer["workload"]] = (timed / timed_other, seconds_other / seconds)
    return ratios


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answers", help="a file written by scripts.replay.lookup --record")
    parser.add_argument("--pairs", default="auto/auto,auto/lookup", help="FIRST/SECOND method pairs to compare")
    parser.add_argument("--seeds", type=int, default=30, help="bench runs to simulate per pair")
    parser.add_argument("--drift", type=float, default=0.03, help="per-answer speed spread (log-normal sigma)")
    parser.add_argument("--jitter", type=float, default=0.015, help="per-pass spread (log-normal sigma)")
    parser.add_argument("--bar", type=float, default=0.97, help="the ratio a run must keep on every slice")
    parser.add_argument("--max-tokens", type=int, default=QUICK_TOKENS)
    args = parser.parse_args(argv)
    replay = Replay.load(args.answers)
    print(f"{args.seeds} runs per pair, drift {args.drift:.1%} per answer, jitter {args.jitter:.1%} per pass; "
          f"per slice: 10th percentile of the ratio, and the share of runs below {args.bar}")
    for pair in args.pairs.split(","):
        methods = tuple(pair.split("/"))
        runs = [one_run(replay, methods, seed, args) for seed in range(args.seeds)]
        print(f"\n{pair:14} {'timed':>8} {'below':>6} {'decisions':>10} {'below':>6}")
        for workload in runs[0]:
            timed, decided = (np.array([run[workload][i] for run in runs]) for i in (0, 1))
            print(f"{workload:14} {np.percentile(timed, 10):8.3f} {np.mean(timed < args.bar):6.0%} "
                  f"{np.percentile(decided, 10):10.3f} {np.mean(decided < args.bar):6.0%}")
        clear = [sum(all(ratio[i] >= args.bar for ratio in run.values()) for run in runs) for i in (0, 1)]
        print(f"{'every slice':14} {clear[0]:>8}/{args.seeds} runs {clear[1]:>8}/{args.seeds} runs")


if __name__ == "__main__":
    main()
