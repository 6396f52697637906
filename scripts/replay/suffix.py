"""Replays `auto` with an answer history (suffix decoding) on recorded agent-repeat answers.

The real decoder, drafters and controller run against recording.py's ``ReplayTarget`` (the recorded
greedy answers, the recorded pass costs on a simulated clock). The history learns as
`localspec bench --workloads agent-repeat --methods auto+history` does: a cold pass over the 20 requests
(each answer stored after it), then a warm pass over them again, where it learns nothing more. One decoder
per pass, as the bench keeps one. Beside it, `auto` without a history on the same answers. Replayed
figures leave out Python overhead and machine noise: they rank changes, `localspec bench` measures them.

    .venv/bin/python -m scripts.replay.suffix --record /tmp/replay/repeat.json [--target FILE]  # about 2 min
    .venv/bin/python -m scripts.replay.suffix /tmp/replay/repeat.json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from localspec.engine.persist.history import HistoryStore
from scripts.replay.recording import Replay, record

WORKLOAD = "agent-repeat"
MAX_TOKENS = 128  # as the bench slice is run in the closing notes


def replay_pass(replay: Replay, answers: list[dict], history: HistoryStore | None) -> dict:
    """Totals of one pass over ``answers`` with one decoder."""
    decoder = replay.decoder("auto", history)
    totals = {"target_alone_s": 0.0, "seconds": 0.0, "passes": 0, "tokens": 0, "suffix": 0, "lookup": 0}
    for answer in answers:
        speedup, _, _ = replay.run(decoder, answer, MAX_TOKENS)
        stats = decoder.stats
        tokens = stats.generated_tokens - 1  # the first comes from the prefill
        totals["seconds"] += stats.decode_s
        totals["target_alone_s"] += replay.cost(1) * tokens
        totals["passes"] += stats.target_passes - 1
        totals["tokens"] += tokens
        for source in ("suffix", "lookup"):
            totals[source] += stats.accepted_by_source.get(source, 0)
    return totals


def report(path: str) -> None:
    replay = Replay.load(path)
    answers = [a for a in replay.answers if a["workload"] == WORKLOAD]
    if not answers:
        raise SystemExit(f"{path} holds no {WORKLOAD} answers; record them with --record FILE")
    print(f"{len(answers)} {WORKLOAD} answers; speedup over target alone from recorded pass costs")
    print(f"{'pass':5} {'history':8} {'speedup':>8} {'tok/pass':>9} {'from history':>13} {'from lookup':>12}")
    for with_history in (True, False):
        history = HistoryStore(None) if with_history else None
        for name in ("cold", "warm"):
            if history is not None:
                history.learning = name == "cold"
            t = replay_pass(replay, answers, history)
            print(f"{name:5} {'yes' if with_history else 'no':8} {t['target_alone_s'] / t['seconds']:7.3f}x "
                  f"{t['tokens'] / t['passes']:9.2f} {t['suffix']:13} {t['lookup']:12}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answers", nargs="?", help="a file written by --record")
    parser.add_argument("--record", metavar="FILE", help="record the target's greedy agent-repeat answers")
    parser.add_argument("--threads", type=int, help="recording: target threads (default: the machine's)")
    parser.add_argument("--target", type=Path, help="recording: this GGUF file (default: the default profile's)")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record, [WORKLOAD], MAX_TOKENS, threads=args.threads, target=args.target)
    elif args.answers:
        report(args.answers)
    else:
        parser.error("give a recorded answers file, or --record FILE")


if __name__ == "__main__":
    main()
