#!/usr/bin/env python3
"""Token tree or best branch? Replays `auto` with an answer history on recorded agent-repeat answers.

Suffix decoding (engine/suffix.py) drafts the best-supported branch where earlier answers disagree. A
token tree would verify the runner-up branch beside it in the same target pass (one more sequence id),
so a rejection at the split could still accept the runner-up's tokens; every such round pays for the
runner-up's rows whether it wins or not. This replays both on the same greedy answers and pass costs:

- ``branch``: what the decoder does, the draft the controller picks;
- ``tree``: the same draft plus the runner-up branch from the split on (as deep as the draft), priced as
  a pass of all those rows, the longer matching path accepted;
- ``oracle tree``: the tree's tokens, but the runner-up's rows paid only in rounds where it wins (no real
  tree can do better), which bounds what any policy for adding branches could gain.

The history learns as `localspec bench --workloads agent-repeat --methods auto+history` does: a cold pass
over the 20 requests (each answer stored after it), then a warm pass over them again. One controller per
pass, as the bench keeps one decoder. Replayed figures leave out Python overhead and machine noise.

    .venv/bin/python scripts/replay_suffix.py --record repeat.json   # about 2 minutes
    .venv/bin/python scripts/replay_suffix.py repeat.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from replay_lookup import interpolate, record

from localspec.engine.controller import TRUSTED_SAMPLES, Controller
from localspec.engine.decoder import LOOKUP_MAX_NGRAM
from localspec.engine.history import HistoryStore
from localspec.engine.lookup import PromptLookupProposer
from localspec.engine.suffix import SEPARATOR

WORKLOAD = "agent-repeat"
MAX_TOKENS = 128  # as the bench slice is run in the closing notes
MODES = ("branch", "tree", "oracle tree")


@dataclass
class Totals:
    seconds: float = 0.0
    target_alone_s: float = 0.0
    passes: int = 0
    tokens: int = 0
    trees: int = 0  # suffix rounds that verified a runner-up branch
    runner_up_won: int = 0
    runner_up_tokens: int = 0  # tokens accepted from it


def matching(draft: list[int], target: list[int]) -> int:
    hits = 0
    while hits < len(draft) and hits < len(target) and draft[hits] == target[hits]:
        hits += 1
    return hits


def replay_pass(answers: list[dict], store: HistoryStore, mode: str, cost) -> Totals:
    controller = Controller("auto")
    for _ in range(TRUSTED_SAMPLES):
        controller.record_pass(1, cost(1))
    totals = Totals()
    for answer in answers:
        target = answer["answer"]
        context = list(answer["prompt"]) + target[:1]  # the prefill gives the first token
        lookup = PromptLookupProposer(max_ngram=LOOKUP_MAX_NGRAM)
        lookup.extend(context)
        position = 1
        while position < len(target):
            room = len(target) - position - 1
            proposal = lookup.propose(controller.lookup_max)
            suffix = store.index.propose(context, controller.lookup_max)
            plan = controller.plan(
                lookup_available=len(proposal), lookup_match_len=lookup.last_match_len,
                suffix_available=len(suffix.tokens), suffix_match_len=suffix.match_len,
                generated=position, remaining=MAX_TOKENS - position,
            )
            k = min(plan.k, room)
            draft = {"lookup": proposal, "suffix": suffix.tokens}.get(plan.method, [])[:k]
            ahead = target[position:]
            accepted = matching(draft, ahead)
            rows = 1 + len(draft)
            if mode != "branch" and plan.method == "suffix" and suffix.runner_up and suffix.runner_up[0] < len(draft):
                split, source = suffix.runner_up
                stored = store.index.tokens
                branch = []
                for token in stored[source : source + len(draft) - split].tolist():
                    if token == SEPARATOR:
                        break
                    branch.append(token)
                won = matching(branch, ahead[split:]) if accepted == split else 0
                if won:
                    totals.runner_up_won += 1
                    totals.runner_up_tokens += won
                if mode == "tree" or won:
                    rows += len(branch)
                    totals.trees += 1
                accepted += won
            spent = cost(rows)
            totals.seconds += spent
            totals.passes += 1
            controller.record_pass(rows, spent)
            if draft:
                controller.record_round(plan.method, suffix.match_len if plan.method == "suffix" else
                                        lookup.last_match_len, len(draft), min(accepted, len(draft)))
            if plan.method == "suffix" and draft:
                store.record(suffix.sources[: len(draft)], matching(draft, ahead))
            step = target[position : position + accepted + 1]
            context += step
            lookup.extend(step)
            position += len(step)
        totals.tokens += len(target) - 1
        totals.target_alone_s += cost(1) * (len(target) - 1)
        store.add(answer["prompt"], target)
    return totals


def report(path: str) -> None:
    with open(path) as handle:
        recorded = json.load(handle)
    cost = interpolate({int(size): seconds for size, seconds in recorded["pass_s"].items()})
    answers = [a for a in recorded["answers"] if a["workload"] == WORKLOAD]
    print(f"{len(answers)} {WORKLOAD} answers; speedup over target alone from recorded pass costs")
    print(f"{'pass':5} {'mode':12} {'speedup':>8} {'tok/pass':>9} {'trees':>6} {'runner-up won':>14} {'its tokens':>11}")
    for mode in MODES:
        store = HistoryStore(None)
        for name in ("cold", "warm"):
            t = replay_pass(answers, store, mode, cost)
            print(
                f"{name:5} {mode:12} {t.target_alone_s / t.seconds:7.3f}x {t.tokens / t.passes:9.2f} "
                f"{t.trees:6} {t.runner_up_won:14} {t.runner_up_tokens:11}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("answers", nargs="?", help="a file written by --record")
    parser.add_argument("--record", metavar="FILE", help="record the target's greedy agent-repeat answers")
    args = parser.parse_args()
    if args.record:
        record(args.record, [WORKLOAD], MAX_TOKENS)
    elif args.answers:
        report(args.answers)
    else:
        parser.error("give a recorded answers file, or --record FILE")


if __name__ == "__main__":
    main()
