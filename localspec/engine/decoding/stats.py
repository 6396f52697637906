"""One object holds every figure a user sees, so the live view, ``run --json`` and ``bench`` agree."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from localspec.engine.drafters.base import TARGET_ALONE


def judged(drafted: int, accepted: int) -> int:
    """Draft positions one round judged: the target checks drafts up to and including the first rejection."""
    return min(drafted, accepted + 1)


class Idle(str, Enum):
    """Why the planner kept a round to the target alone (the words every front end shows)."""

    METHOD_NONE = "the method is none"
    NO_ROLLBACK = "this target's memory cannot roll back"
    MEASURING = "the answer ended while the target's passes were still being timed"
    NOTHING_OFFERED = "nothing to copy here"
    PRICED_OUT = "nothing on offer was expected to beat the target alone"
    UNSURE = "the draft model was unsure of its next token"

    __str__ = str.__str__
    __format__ = str.__format__


class StopReason(str, Enum):
    """Why an answer ended (``GenerationStats.stop_reason``; the APIs map these to their own words)."""

    EOS = "eos"  # the model ended it
    LENGTH = "length"  # the token budget ran out
    STOP_STRING = "stop_string"  # a stop string the caller gave
    CONTEXT_FULL = "context_full"  # the context window ran out

    __str__ = str.__str__
    __format__ = str.__format__


@dataclass
class Planned:
    """The planner's expectation for the rounds it priced with one choice, against what they gave: so a
    cost or acceptance model that is off on this machine shows in one answer, not only in whole-run speed."""

    rounds: int = 0
    expected_tokens: float = 0.0
    tokens: int = 0
    expected_s: float = 0.0
    seconds: float = 0.0

    def add(self, other: Planned) -> None:
        self.rounds += other.rounds
        self.expected_tokens += other.expected_tokens
        self.tokens += other.tokens
        self.expected_s += other.expected_s
        self.seconds += other.seconds

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds,
            "expected_tokens": round(self.expected_tokens, 2),
            "tokens": self.tokens,
            "expected_s": round(self.expected_s, 4),
            "seconds": round(self.seconds, 4),
            # Above 1: the choice yielded more tokens, or took longer, than the planner expected.
            "tokens_ratio": round(self.tokens / self.expected_tokens, 3) if self.expected_tokens else None,
            "time_ratio": round(self.seconds / self.expected_s, 3) if self.expected_s else None,
        }


@dataclass
class GenerationStats:
    """Counts and times for one generation (one answer)."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually evaluated (the rest came from the KV cache)
    generated_tokens: int = 0
    target_passes: int = 0  # passes that produced a token: the prefill's, then one per verification
    drafted: int = 0
    accepted: int = 0
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    rounds_by_source: dict[str, int] = field(default_factory=dict)
    # per_position_drafted[i] / per_position_accepted[i]: drafts that reached position i / were accepted there
    # (a position no draft reached is not listed).
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    overhead_s: float = 0.0
    rollback_s: float = 0.0  # recurrent state: checkpoints saved, restored and accepted tokens replayed
    replayed_tokens: int = 0  # tokens evaluated again because a recurrent state could not cut them out
    first_token_s: float | None = None  # time to first token, from the start of the generation
    stop_reason: StopReason | None = None
    kernels: str = ""  # "exact" (bit-identical verification) or "fast" (stock kernels), see engine/llama/kernels.py
    memory: str = ""  # the target's memory and how it rolls back (MemoryPlan.describe)
    controller: dict = field(default_factory=dict)  # the controller's cost and acceptance beliefs at the end
    draft_status: str | None = None  # whether auto uses the draft model and why; None without one
    explored_rounds: int = 0  # rounds that probed a drafter whose estimate may be too low
    idle: dict[str, int] = field(default_factory=dict)  # rounds kept to the target alone, by Idle reason
    memory_kind: str = ""  # the target's MemoryKind
    planned: dict[str, Planned] = field(default_factory=dict)  # by the planner's choice (its priced rounds)

    def record_round(self, source: str, drafted: int, accepted: int, *, idle: Idle | None = None,
                     explored: bool = False) -> None:
        """A round that drafted ``drafted`` tokens from ``source`` (TARGET_ALONE: none) and kept ``accepted``."""
        self.target_passes += 1
        self.explored_rounds += explored
        if idle is not None:
            self.idle[idle] = self.idle.get(idle, 0) + 1
        self.rounds_by_source[source] = self.rounds_by_source.get(source, 0) + 1
        if drafted == 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.drafted_by_source[source] = self.drafted_by_source.get(source, 0) + drafted
        self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + accepted
        reached = judged(drafted, accepted)  # positions past the first rejection were never judged
        while len(self.per_position_drafted) < reached:
            self.per_position_drafted.append(0)
            self.per_position_accepted.append(0)
        for i in range(reached):
            self.per_position_drafted[i] += 1
            if i < accepted:
                self.per_position_accepted[i] += 1

    def record_plan(self, choice: str, expected_tokens: float, expected_s: float, tokens: int, seconds: float) -> None:
        """A round the planner priced: what it expected of ``choice`` and what the round gave."""
        self.planned.setdefault(choice, Planned()).add(Planned(1, expected_tokens, tokens, expected_s, seconds))

    @classmethod
    def pooled(cls, generations: Iterable[GenerationStats]) -> GenerationStats:
        """Counts and times of several generations added up, so figures pooled over runs use the same rules."""
        total = cls()
        for s in generations:
            for name in ("prompt_tokens", "prefill_tokens", "generated_tokens", "target_passes", "drafted", "accepted",
                         "prefill_s", "draft_s", "verify_s", "overhead_s", "rollback_s", "replayed_tokens",
                         "explored_rounds"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
            for mine, theirs in ((total.drafted_by_source, s.drafted_by_source),
                                 (total.accepted_by_source, s.accepted_by_source),
                                 (total.rounds_by_source, s.rounds_by_source), (total.idle, s.idle)):
                for key, n in theirs.items():
                    mine[key] = mine.get(key, 0) + n
            for mine, theirs in ((total.per_position_drafted, s.per_position_drafted),
                                 (total.per_position_accepted, s.per_position_accepted)):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, n in enumerate(theirs):
                    mine[i] += n
            for choice, planned in s.planned.items():
                total.planned.setdefault(choice, Planned()).add(planned)
        return total

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target pass (accepted drafts plus the target's own token)."""
        return self.generated_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d for a, d in zip(self.per_position_accepted, self.per_position_drafted)]

    @property
    def decode_s(self) -> float:
        return self.draft_s + self.verify_s + self.overhead_s + self.rollback_s

    @property
    def decode_tok_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tok_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    def to_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens": self.prefill_tokens,
            "generated_tokens": self.generated_tokens,
            "target_passes": self.target_passes,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 3),
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
            "per_position_drafted": list(self.per_position_drafted),
            "by_source": {
                s: {
                    "rounds": self.rounds_by_source.get(s, 0),
                    "drafted": self.drafted_by_source.get(s, 0),
                    "accepted": self.accepted_by_source.get(s, 0),
                }
                for s in sorted(self.rounds_by_source)
            },
            "time_s": {
                "prefill": round(self.prefill_s, 4),
                "draft": round(self.draft_s, 4),
                "verify": round(self.verify_s, 4),
                "overhead": round(self.overhead_s, 4),
                "rollback": round(self.rollback_s, 4),
            },
            "replayed_tokens": self.replayed_tokens,
            "ttft_s": None if self.first_token_s is None else round(self.first_token_s, 4),
            "decode_tok_per_s": round(self.decode_tok_per_s, 2),
            "prefill_tok_per_s": round(self.prefill_tok_per_s, 2),
            "stop_reason": self.stop_reason,
            "kernels": self.kernels,
            "memory": self.memory,
            "controller": self.controller,
            "draft_status": self.draft_status,
            "explored_rounds": self.explored_rounds,
            "planned": {choice: planned.to_dict() for choice, planned in sorted(self.planned.items())},
            "controller_note": self.controller_note,
        }

    @property
    def controller_note(self) -> str:
        """What the controller did in this answer, in a few words; also when it drafted nothing."""
        if not self.drafted:
            reason = max(self.idle, key=self.idle.get) if self.idle else Idle.MEASURING
            return f"no drafts: {reason}"
        speculated = self.target_passes - self.rounds_by_source.get(TARGET_ALONE, 0)
        sources = ", ".join(f"{s} {n}" for s, n in sorted(self.rounds_by_source.items()) if s != TARGET_ALONE)
        probes = f"; {self.explored_rounds} exploratory" if self.explored_rounds else ""
        return f"drafted in {speculated} of {self.target_passes} rounds ({sources}{probes})"

    def summary_line(self) -> str:
        """One plain line of figures for the end of an answer (the CLI's and the server log's)."""
        parts = [f"{self.generated_tokens} tokens", f"{self.decode_tok_per_s:.1f} tok/s", f"{self.target_passes} target passes"]
        if self.drafted:
            by_source = ", ".join(
                f"{s} {self.accepted_by_source.get(s, 0)}/{n}" for s, n in sorted(self.drafted_by_source.items())
            )
            parts.append(f"accepted {self.acceptance_rate:.0%} ({by_source})")
            parts.append(f"{self.mean_accepted_length:.2f} tokens/pass")
        parts.append(self.controller_note)
        parts.append(f"prefill {self.prefill_tokens} tok in {self.prefill_s:.2f}s")
        if self.replayed_tokens:
            parts.append(f"{self.replayed_tokens} tokens replayed ({self.rollback_s:.2f}s on rollbacks)")
        parts.append(f"stop: {self.stop_reason}")
        parts.append(f"{self.kernels} kernels")
        return " | ".join(parts)
