#!/usr/bin/env python3
"""Replay `auto`'s decisions on recorded greedy answers, to tune the drafters and the planner.

Recording runs the real target once per shipped bench prompt (greedy, target alone) and measures its pass
time per batch size. Replaying needs no model: the real decoder, drafters and controller run against a
``ReplayTarget`` that predicts the recorded answer and takes the recorded pass time of each batch on a
simulated clock, so a replay makes exactly the decisions a live run would on those costs. It prints, per
slice, the speedup over target alone those pass costs imply and the acceptance, for `auto` (no draft
model, no answer history), for `--method lookup`, and for stock llama.cpp's ngram-simple (a 12-token match
drafts the 48 tokens that followed it) replayed the same way. Replayed figures leave out Python overhead
and machine noise: they rank changes, `localspec bench` measures them.

    .venv/bin/python scripts/replay_lookup.py --record /tmp/replay/answers.json [--target FILE]  # 5 min alone
    .venv/bin/python scripts/replay_lookup.py /tmp/replay/answers.json [--max-tokens 96]

``record`` also serves scripts/replay_suffix.py, for the agent-repeat slice.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from bench_engine import pass_costs

import localspec.engine.decoding.decoder
from localspec.bench.runner import BASELINE, DEFAULT_WARMUP_TOKENS, BenchRunner, BenchSettings
from localspec.bench.workloads import select, shipped_prompts
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.llama.kernels import EXACT
from localspec.engine.llama.memory import MemoryPlan
from localspec.engine.persist.history import HistoryStore
from localspec.engine.tokens import common_prefix_length
from localspec.gguf.memory import MemoryKind
from localspec.profiles import DEFAULT_PROFILE
from localspec.session import ModelOptions, open_decoder, resolve_pair

RECORD_TOKENS = 256
COST_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def record(
    path: str,
    workloads: list[str] | None = None,
    max_tokens: int = RECORD_TOKENS,
    *,
    threads: int | None = None,
    per_slice: int | None = None,
    costs_file: str | None = None,
    target: Path | None = None,
) -> None:
    """Greedy answers of target alone to the shipped prompts (of ``workloads``; None: the default slices;
    ``per_slice`` of each), and the target's pass costs (measured, or read from ``costs_file``: a JSON
    object of seconds by batch size, for a machine too busy to measure them). The default profile's target
    unless ``target`` names a GGUF file."""
    pair = resolve_pair(target=target) if target else resolve_pair(profile=DEFAULT_PROFILE)
    decoder = open_decoder(pair, ModelOptions(threads=threads), method="none", history=False)
    if costs_file:
        with open(costs_file) as handle:
            costs = {int(size): float(seconds) for size, seconds in json.load(handle).items()}
    else:
        costs, _ = pass_costs(decoder.target, sizes=COST_SIZES)
    runner = BenchRunner(decoder, BenchSettings([BASELINE], max_tokens=max_tokens))
    answers = []
    for prompt in select(shipped_prompts(), workloads, per_workload=per_slice):
        item = runner.prepare(prompt)
        decoder.target.reset()
        steps = decoder.generate(item.tokens, max_tokens=max_tokens)
        answer = [token for step in steps for token in step.tokens]
        answers.append({"workload": prompt.workload, "id": prompt.id, "prompt": item.tokens, "answer": answer})
        print(f"{prompt.workload}/{prompt.id}: {len(item.tokens)} prompt tokens, {len(answer)} answer tokens",
              flush=True)
    with open(path, "w") as handle:
        json.dump({"pass_s": costs, "answers": answers}, handle)


def interpolate(costs: dict[int, float]) -> Callable[[int], float]:
    sizes = sorted(costs)

    def cost(batch: int) -> float:
        for low, high in zip(sizes, sizes[1:]):
            if batch <= high:
                return costs[low] + (batch - low) / (high - low) * (costs[high] - costs[low])
        return costs[sizes[-1]] * batch / sizes[-1]

    return cost


def ngram_simple(history: list[int], n: int = 12, m: int = 48) -> list[int]:
    """llama.cpp's ngram-simple: the m tokens after the latest earlier occurrence of the last n."""
    pattern = history[-n:]
    for start in range(len(history) - n - 1, 0, -1):
        if history[start : start + n] == pattern:
            copy = history[start + n : start + n + m]
            return copy if len(copy) >= n else []
    return []


class Clock:
    """Simulated seconds: only the target's passes take time (the decoder reads it as perf_counter)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ReplayTarget:
    """Stands in for Model: its greedy choice at every position is the recorded answer's token, and
    each verification pass takes the recorded time of its batch size. Token ids are compact (see
    ``Replay``), the end of an answer is ``eos``."""

    kernels = EXACT
    memory_plan = MemoryPlan(MemoryKind.KV, 0, 0)
    large_eval = None
    replayed_tokens = 0
    n_ctx = 1 << 20
    mtp_layers = 0  # the recorded target is replayed without a head of its own

    def __init__(self, n_vocab: int, eos: int, cost: Callable[[int], float], clock: Clock) -> None:
        self.n_vocab, self.eos, self.cost, self.clock = n_vocab, eos, cost, clock
        self.tokens: list[int] = []
        self.truth: list[int] = []

    def expect(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        self.truth = [*prompt, *answer, self.eos]

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix_length(self.tokens, tokens)

    def rollback(self, n_past: int) -> float:
        del self.tokens[n_past:]
        return 0.0

    def can_remove(self, n: int) -> bool:
        return True

    def is_end_of_generation(self, token: int) -> bool:
        return token == self.eos

    def eval(self, tokens: Sequence[int], *, n_logits: int = 1, progress=None, prefill: bool = False) -> np.ndarray:
        self.tokens.extend(tokens)
        if not prefill:
            self.clock.now += self.cost(len(tokens))
        rows = np.zeros((n_logits, self.n_vocab), dtype=np.float32)
        last = len(self.truth) - 1
        for i, position in enumerate(range(len(self.tokens) - n_logits + 1, len(self.tokens) + 1)):
            rows[i, self.truth[min(position, last)]] = 1.0  # rows past a wrong draft are never read
        return rows


class Replay:
    """Recorded answers on compact token ids (one row of logits per id), replayed through real decoders."""

    def __init__(self, recorded: dict) -> None:
        measured = {int(size): seconds for size, seconds in recorded["pass_s"].items()}
        self.cost = interpolate(measured)
        # What a live session on the recording machine finds in pass-costs.json after its first sessions.
        self.remembered = {size: seconds / measured[1] for size, seconds in measured.items()}
        ids: dict[int, int] = {}
        compact = lambda tokens: [ids.setdefault(t, len(ids)) for t in tokens]  # noqa: E731
        self.answers = [
            {**a, "prompt": compact(a["prompt"]), "answer": compact(a["answer"])} for a in recorded["answers"]
        ]
        self.eos = len(ids)
        self.clock = Clock()
        localspec.engine.decoding.decoder.perf_counter = self.clock

    def decoder(self, method: str = "auto", history: HistoryStore | None = None) -> SpeculativeDecoder:
        """One per session, as bench keeps its decoders across prompts, remembering the recorded pass costs
        and warmed up as bench warms them up (its first measurements of one-token passes)."""
        decoder = SpeculativeDecoder(ReplayTarget(self.eos + 1, self.eos, self.cost, self.clock), method=method,
                                     history=history)
        decoder.controller.remember(self.remembered)
        answers = history or HistoryStore(None)  # the warm-up learns nothing, as in bench
        learning, answers.learning = answers.learning, False
        self.run(decoder, self.answers[0], DEFAULT_WARMUP_TOKENS)
        answers.learning = learning
        return decoder

    def run(self, decoder: SpeculativeDecoder, answer: dict, max_tokens: int) -> tuple[float, int, int]:
        """(speedup over target alone, drafted, accepted) of one answer."""
        target = answer["answer"][:max_tokens]
        decoder.target.expect(answer["prompt"], answer["answer"])
        decoder.target.rollback(0)
        for _ in decoder.generate(answer["prompt"], max_tokens=len(target)):
            pass
        stats = decoder.stats
        assert stats.generated_tokens == len(target), "the replay left the recorded answer"
        return self.cost(1) * (len(target) - 1) / stats.decode_s, stats.drafted, stats.accepted


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
    with open(path) as handle:
        replay = Replay(json.load(handle))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answers", nargs="?", help="a file written by --record")
    parser.add_argument("--record", metavar="FILE", help="record the target's greedy answers and pass costs")
    parser.add_argument("--max-tokens", type=int, default=RECORD_TOKENS)
    parser.add_argument("--threads", type=int, help="recording: target threads (default: the machine's)")
    parser.add_argument("--per-slice", type=int, help="recording: prompts per slice (default: all)")
    parser.add_argument("--pass-costs", metavar="FILE", help="recording: pass seconds by batch size, not measured")
    parser.add_argument("--target", type=Path, help="recording: this GGUF file (default: the default profile's)")
    args = parser.parse_args()
    if args.record:
        record(args.record, max_tokens=args.max_tokens, threads=args.threads, per_slice=args.per_slice,
               costs_file=args.pass_costs, target=args.target)
    elif args.answers:
        report(args.answers, args.max_tokens)
    else:
        parser.error("give a recorded answers file, or --record FILE")


if __name__ == "__main__":
    main()
