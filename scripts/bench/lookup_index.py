"""Print what prompt lookup costs per generated token as the session grows (figures, not asserts).

Each history mixes fresh random text with copies of earlier stretches, as a code-edit session does.
A decode step is one ``propose`` plus one ``extend`` of the accepted token; the figure should stay flat
from 1k to 100k tokens because neither rescans the history.

    .venv/bin/python -m scripts.bench.lookup_index [--sizes 1000,10000,100000] [--steps 5000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from localspec.engine.drafters.lookup_index import PromptLookupIndex

SIZES = (1_000, 10_000, 100_000)
STEPS = 5_000
DRAFT = 16


def make_history(size: int, rng: np.random.Generator) -> list[int]:
    """Random tokens where every other stretch of 50 copies an earlier stretch."""
    history: list[int] = []
    while len(history) < size:
        if history and rng.random() < 0.5:
            start = int(rng.integers(0, len(history)))
            history += history[start : start + 50]
        else:
            history += rng.integers(0, 32_000, size=50).tolist()
    return history[:size]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="history lengths, comma-separated")
    parser.add_argument("--steps", type=int, default=STEPS, help="decode steps timed after each history")
    args = parser.parse_args(argv)
    steps = args.steps
    rng = np.random.default_rng(0)
    print(f"{'history':>8} {'build us/tok':>13} {'step us/tok':>12} {'propose us':>11} {'matched':>8}")
    for size in map(int, args.sizes.split(",")):
        history = make_history(size + steps, rng)
        index = PromptLookupIndex()
        start = time.perf_counter()
        index.extend(history[:size])
        build = (time.perf_counter() - start) / size

        propose_time = step_time = 0.0
        matched = 0
        for token in history[size:]:
            t0 = time.perf_counter()
            matched += bool(index.propose(DRAFT))
            t1 = time.perf_counter()
            index.extend([token])
            t2 = time.perf_counter()
            propose_time += t1 - t0
            step_time += t2 - t0
        print(
            f"{size:>8} {build * 1e6:>13.2f} {step_time / steps * 1e6:>12.2f} "
            f"{propose_time / steps * 1e6:>11.2f} {matched / steps:>8.0%}"
        )


if __name__ == "__main__":
    main()
