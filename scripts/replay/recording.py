"""Recorded greedy answers, and the stand-in target that replays them (shared by the replays beside it).

Recording runs the real target once per shipped bench prompt (greedy, target alone) and measures its pass
time per batch size. Replaying needs no model: the real decoder, drafters and controller run against a
``ReplayTarget`` that predicts the recorded answer and takes the recorded pass time of each batch on a
simulated clock, so a replay makes exactly the decisions a live run would on those costs. Replayed figures
leave out Python overhead and machine noise: they rank changes, `localspec bench` measures them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from localspec.bench.runner import BASELINE, DEFAULT_WARMUP_TOKENS, BenchRunner, BenchSettings, in_lockstep
from localspec.bench.workloads import for_target, select, shipped_prompts
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.llama.kernels import EXACT
from localspec.engine.llama.memory import MemoryPlan
from localspec.engine.persist.history import HistoryStore
from localspec.engine.planner.costs import Costs
from localspec.engine.tokens import common_prefix_length
from localspec.gguf.memory import MemoryKind
from localspec.profiles import DEFAULT_PROFILE
from localspec.session import ModelOptions, open_decoder, resolve_pair
from scripts.bench.engine import pass_costs

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
    prompts, note = for_target(select(shipped_prompts(), workloads, per_workload=per_slice), decoder.target,
                               named=workloads is not None)
    if note:
        print(note, file=sys.stderr)
    for prompt in prompts:
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


class Clock:
    """Simulated seconds, the decoders' clock: only the target's passes take time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class ReplayTarget:
    """A ``Target`` (engine/decoding/target.py) whose greedy choice at every position is the recorded
    answer's token, and whose verification passes take the recorded time of their batch size. Token ids are
    compact (see ``Replay``), the end of an answer is ``eos``."""

    kernels = EXACT
    memory_plan = MemoryPlan(MemoryKind.KV, 0, 0)
    # Its prompt passes take no simulated time, so none hints at long drafts' cost (the shape figures that
    # would price such a hint are then never read).
    large_eval = None
    n_embd_out = n_params = 0
    replayed_tokens = 0
    n_ctx = 1 << 20
    mtp_layers = 0  # the recorded target is replayed without a head of its own
    keeps_head_inputs = False
    last_rows = 0

    def __init__(self, n_vocab: int, eos: int, cost: Callable[[int], float], clock: Clock,
                 noise: Callable[[], float] | None = None) -> None:
        self.n_vocab, self.eos, self.cost, self.clock = n_vocab, eos, cost, clock
        self.noise = noise  # a factor on each pass's time, as a busy machine's timings stray (spread.py)
        self.recorded_s = 0.0  # the passes' recorded seconds, whatever the noise made of them
        self.tokens: list[int] = []
        self.truth: list[int] = []

    def expect(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        self.truth = [*prompt, *answer, self.eos]

    @property
    def n_past(self) -> int:
        return len(self.tokens)

    def token_bytes(self, token: int) -> bytes:
        return b"<%d>" % token  # compact ids carry no text: each shows as its id

    def is_end_of_generation(self, token: int) -> bool:
        return token == self.eos

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix_length(self.tokens, tokens)

    def eval(self, tokens: Sequence[int], *, n_logits: int = 1, progress=None, prefill: bool = False) -> np.ndarray:
        self.tokens.extend(tokens)
        self.last_rows = len(tokens)
        if not prefill:
            seconds = self.cost(len(tokens))
            self.recorded_s += seconds
            self.clock.now += seconds * (self.noise() if self.noise is not None else 1.0)
        rows = np.zeros((n_logits, self.n_vocab), dtype=np.float32)
        last = len(self.truth) - 1
        for i, position in enumerate(range(len(self.tokens) - n_logits + 1, len(self.tokens) + 1)):
            rows[i, self.truth[min(position, last)]] = 1.0  # rows past a wrong draft are never read
        return rows

    def can_remove(self, n: int) -> bool:
        return True

    def checkpoint(self) -> float:
        return 0.0  # never asked for: every position rolls back in place

    def rollback(self, n_past: int) -> float:
        del self.tokens[n_past:]
        return 0.0

    def another_context(self) -> ReplayTarget:
        other = ReplayTarget(self.n_vocab, self.eos, self.cost, self.clock, self.noise)
        other.truth = self.truth
        return other

    def close(self) -> None:
        """Nothing to free: a replay holds no llama.cpp context."""


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

    @classmethod
    def load(cls, path: str) -> Replay:
        with open(path) as handle:
            return cls(json.load(handle))

    def decoder(self, method: str = "auto", history: HistoryStore | None = None,
                noise: Callable[[], float] | None = None, costs: Costs | None = None) -> SpeculativeDecoder:
        """One per session, as bench keeps its decoders across prompts, remembering the recorded pass costs
        and warmed up as bench warms them up (its first measurements of one-token passes); ``noise``: see
        ``ReplayTarget``; ``costs``: another decoder's, shared as bench's configurations share them."""
        target = ReplayTarget(self.eos + 1, self.eos, self.cost, self.clock, noise)
        decoder = SpeculativeDecoder(target, method=method, history=history, clock=self.clock, costs=costs)
        if costs is None:
            decoder.controller.remember(self.remembered)
        answers = history or HistoryStore(None)  # the warm-up learns nothing, as in bench
        learning, answers.learning = answers.learning, False
        self.run(decoder, self.answers[0], DEFAULT_WARMUP_TOKENS)
        answers.learning = learning
        return decoder

    def run(self, decoder: SpeculativeDecoder, answer: dict, max_tokens: int) -> tuple[float, int, int]:
        """(speedup over target alone, drafted, accepted) of one answer."""
        return self.run_together([decoder], answer, max_tokens)[0]

    def run_together(
        self, decoders: Sequence[SpeculativeDecoder], answer: dict, max_tokens: int
    ) -> list[tuple[float, int, int]]:
        """``run`` for decoders sharing their costs, advanced as bench advances its configurations
        (``in_lockstep``)."""
        target = answer["answer"][:max_tokens]
        generations = []
        for decoder in decoders:
            decoder.target.expect(answer["prompt"], answer["answer"])
            decoder.target.rollback(0)
            generations.append(decoder.generate(answer["prompt"], max_tokens=len(target)))
        in_lockstep(generations, decoders[0].controller.costs)
        results = []
        for decoder in decoders:
            stats = decoder.stats
            assert stats.generated_tokens == len(target), "the replay left the recorded answer"
            results.append((self.cost(1) * (len(target) - 1) / stats.decode_s, stats.drafted, stats.accepted))
        return results
