#!/usr/bin/env python3
"""Replay `auto`'s prompt-lookup decisions on recorded greedy answers, to tune the lookup and controller.

Recording runs the real target once per shipped bench prompt (greedy, target alone) and measures its pass
time per batch size. Replaying needs no model: each round, the proposer and the controller see exactly
what they would see live, a draft is accepted as far as it matches the recorded answer, and the round
costs the recorded pass time of its batch. It prints, per slice, the speedup over target alone that those
pass costs imply and the acceptance, for `auto` (lookup only, no draft model) and for stock llama.cpp's
ngram-simple (a 12-token match drafts the 48 tokens that followed it) replayed the same way. Replayed
figures leave out Python overhead and machine noise: they rank changes, `localspec bench` measures them.

    .venv/bin/python scripts/replay_lookup.py --record answers.json   # about 5 minutes
    .venv/bin/python scripts/replay_lookup.py answers.json [--max-tokens 96]

``record`` also serves scripts/replay_suffix.py, for the agent-repeat slice.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable

from bench_engine import pass_costs

from localspec.bench.runner import BASELINE, BenchRunner, BenchSettings
from localspec.bench.workloads import select, shipped_prompts
from localspec.engine.controller import TRUSTED_SAMPLES, Controller
from localspec.engine.decoder import LOOKUP_MAX_NGRAM
from localspec.engine.lookup import PromptLookupProposer
from localspec.profiles import DEFAULT_PROFILE
from localspec.session import ModelOptions, open_decoder, resolve_pair

RECORD_TOKENS = 256
COST_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


def record(path: str, workloads: list[str] | None = None, max_tokens: int = RECORD_TOKENS) -> None:
    """Greedy answers of target alone to the shipped prompts (of ``workloads``; None: the default slices)."""
    decoder = open_decoder(resolve_pair(profile=DEFAULT_PROFILE), ModelOptions(), method="none")
    costs, _ = pass_costs(decoder.target, sizes=COST_SIZES)
    runner = BenchRunner(decoder, BenchSettings([BASELINE], max_tokens=max_tokens))
    answers = []
    for prompt in select(shipped_prompts(), workloads):
        item = runner.prepare(prompt)
        decoder.target.reset()
        steps = decoder.generate(item.tokens, max_tokens=max_tokens)
        answer = [token for step in steps for token in step.tokens]
        answers.append({"workload": prompt.workload, "id": prompt.id, "prompt": item.tokens, "answer": answer})
        print(f"{prompt.workload}/{prompt.id}: {len(item.tokens)} prompt tokens, {len(answer)} answer tokens")
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


def replay(answer: dict, max_tokens: int, cost: Callable[[int], float], controller: Controller | None) -> tuple:
    """(seconds, drafted, accepted) of one answer; ``controller`` None replays ngram-simple."""
    history = list(answer["prompt"]) + answer["answer"][:1]  # the prefill gives the first token
    target = answer["answer"][:max_tokens]
    lookup = PromptLookupProposer(max_ngram=LOOKUP_MAX_NGRAM)
    lookup.extend(history)
    seconds, drafted, accepted, position = 0.0, 0, 0, 1
    while position < len(target):
        room = len(target) - position - 1
        if controller is None:
            draft = ngram_simple(history)[:room]
        else:
            proposal = lookup.propose(controller.lookup_max)
            plan = controller.plan(lookup_available=len(proposal), lookup_match_len=lookup.last_match_len,
                                   generated=position, remaining=max_tokens - position)
            draft = proposal[: min(plan.k, room)] if plan.method == "lookup" else []
        hits = 0
        while hits < len(draft) and draft[hits] == target[position + hits]:
            hits += 1
        spent = cost(len(draft) + 1)
        seconds += spent
        if controller is not None:
            controller.record_pass(len(draft) + 1, spent)
            controller.record_round("lookup" if draft else "none", lookup.last_match_len, len(draft), hits)
        step = target[position : position + hits + 1]
        history += step
        lookup.extend(step)
        position += len(step)
        drafted += len(draft)
        accepted += hits
    return seconds, drafted, accepted


def report(path: str, max_tokens: int) -> None:
    with open(path) as handle:
        recorded = json.load(handle)
    cost = interpolate({int(size): seconds for size, seconds in recorded["pass_s"].items()})
    controller = Controller("auto")  # one per session, as bench keeps its decoders across prompts
    for _ in range(TRUSTED_SAMPLES):  # the one-token passes it measures before any draft
        controller.record_pass(1, cost(1))
    print(f"{'slice':14} {'auto':>6} {'accepted':>9} {'ngram-simple':>13} {'accepted':>9}")
    for workload in dict.fromkeys(a["workload"] for a in recorded["answers"]):
        cells = []
        for engine in (controller, None):
            speedups, drafted, accepted = [], 0, 0
            for answer in (a for a in recorded["answers"] if a["workload"] == workload):
                seconds, d, a = replay(answer, max_tokens, cost, engine)
                speedups.append(cost(1) * (min(len(answer["answer"]), max_tokens) - 1) / seconds)
                drafted, accepted = drafted + d, accepted + a
            mean = math.exp(sum(map(math.log, speedups)) / len(speedups))
            cells.append(f"{mean:5.2f}x {accepted / max(1, drafted):8.0%}")
        print(f"{workload:14} {cells[0]:>16} {cells[1]:>23}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answers", nargs="?", help="a file written by --record")
    parser.add_argument("--record", metavar="FILE", help="record the target's greedy answers and pass costs")
    parser.add_argument("--max-tokens", type=int, default=RECORD_TOKENS)
    args = parser.parse_args()
    if args.record:
        record(args.record)
    elif args.answers:
        report(args.answers, args.max_tokens)
    else:
        parser.error("give a recorded answers file, or --record FILE")


if __name__ == "__main__":
    main()
