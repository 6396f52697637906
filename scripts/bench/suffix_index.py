"""Times suffix decoding's lookup (engine/drafters/suffix_index.py) on a large synthetic answer history.

Prints the index build time, its memory, and the time of one ``propose`` (one round's lookup) for
contexts taken from stored answers (long matches, many occurrences) and for unseen ones. Each draft's
outcome is fed back with ``record`` (a random number of its tokens accepted), as the decoder does after
verifying, so the lookups pay for scoring by outcomes too; ``record``'s own time is printed beside.

    .venv/bin/python -m scripts.bench.suffix_index [--tokens 10000000] [--lookups 2000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from localspec.engine.drafters.suffix_index import SEPARATOR, SuffixIndex

VOCAB = 151_936


def make_history(n_tokens: int, rng: np.random.Generator) -> np.ndarray:
    """Answers of 50-600 tokens: Zipf-distributed tokens, half of them built from a few shared templates
    (so common keys have thousands of occurrences, as JSON and code skeletons do)."""
    templates = [np.minimum(rng.zipf(1.3, 400), VOCAB - 1).astype(np.int32) for _ in range(50)]
    parts, size = [], 0
    while size < n_tokens:
        length = int(rng.integers(50, 600))
        if rng.random() < 0.5:
            answer = templates[int(rng.integers(len(templates)))][:length].copy()
            edits = rng.integers(0, len(answer), size=len(answer) // 20)
            answer[edits] = rng.integers(0, VOCAB, size=len(edits))
        else:
            answer = np.minimum(rng.zipf(1.3, length), VOCAB - 1).astype(np.int32)
        parts += [answer, np.array([SEPARATOR], dtype=np.int32)]
        size += len(answer) + 1
    return np.concatenate(parts)[:n_tokens]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=10_000_000)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--draft", type=int, default=64, help="tokens asked for per lookup")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    history = make_history(args.tokens, rng)
    history[-1] = SEPARATOR

    start = time.perf_counter()
    index = SuffixIndex(history)
    build = time.perf_counter() - start
    table = index._sorted  # noqa: SLF001 - the script reports the index's own memory
    memory = history.nbytes + table.keys.nbytes + table.positions.nbytes + index._outcomes.nbytes  # noqa: SLF001
    print(f"{len(index):,} tokens: built in {build:.2f} s, {memory / 1e6:.0f} MB")

    ends = np.flatnonzero(history == SEPARATOR)
    for label, make_context in (
        ("context from a stored answer", lambda: _stored_context(history, ends, rng)),
        ("unseen context", lambda: rng.integers(0, VOCAB, size=200).tolist()),
    ):
        times, record_times, drafted = [], [], 0
        for _ in range(args.lookups):
            context = make_context()
            t = time.perf_counter()
            draft = index.propose(context, args.draft)
            times.append(time.perf_counter() - t)
            drafted += len(draft.tokens)
            t = time.perf_counter()
            index.record(draft.sources, int(rng.integers(0, len(draft.tokens) + 1)))
            record_times.append(time.perf_counter() - t)
        times_us = np.array(times) * 1e6
        print(
            f"{label}: median {np.median(times_us):.0f} us, p90 {np.percentile(times_us, 90):.0f} us, "
            f"p99 {np.percentile(times_us, 99):.0f} us, "
            f"max {times_us.max():.0f} us; {drafted / args.lookups:.1f} tokens drafted on average; "
            f"record median {np.median(record_times) * 1e6:.0f} us"
        )


def _stored_context(history: np.ndarray, ends: np.ndarray, rng: np.random.Generator) -> list[int]:
    """200 tokens of context ending somewhere inside a stored answer."""
    i = int(rng.integers(1, len(ends)))
    start, end = int(ends[i - 1]) + 1, int(ends[i])
    cut = int(rng.integers(start + 4, max(start + 5, end)))
    return history[max(0, cut - 200) : cut].tolist()


if __name__ == "__main__":
    main()
