"""One object holds every figure a user sees, so the live view, ``run --json`` and ``bench`` agree."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


def judged(drafted: int, accepted: int) -> int:
    """Draft positions one round judged: the target checks drafts up to and including the first rejection."""
    return min(drafted, accepted + 1)


@dataclass
class GenerationStats:
    """Counts and times for one generation (one answer)."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually evaluated (the rest came from the KV cache)
    generated_tokens: int = 0
    rounds: int = 0  # verification rounds = target forward passes after prefill
    drafted: int = 0
    accepted: int = 0
    drafted_by_method: dict[str, int] = field(default_factory=dict)
    accepted_by_method: dict[str, int] = field(default_factory=dict)
    rounds_by_method: dict[str, int] = field(default_factory=dict)
    # per_position_drafted[i] / per_position_accepted[i]: drafts that reached position i / were accepted there.
    per_position_drafted: list[int] = field(default_factory=list)
    per_position_accepted: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    overhead_s: float = 0.0
    rollback_s: float = 0.0  # recurrent state: checkpoints saved, restored and accepted tokens replayed
    replayed_tokens: int = 0  # tokens evaluated again because a recurrent state could not cut them out
    first_token_s: float | None = None  # time to first token, from the start of the generation
    stop_reason: str | None = None
    kernels: str = ""  # "exact" (bit-identical verification) or "fast" (stock kernels), see engine/backend.py
    memory: str = ""  # the target's memory and how it rolls back (MemoryPlan.describe)
    controller: dict = field(default_factory=dict)  # the controller's cost and acceptance beliefs at the end
    draft_status: str | None = None  # whether auto uses the draft model and why; None without one

    def record_round(self, method: str, drafted: int, accepted: int) -> None:
        self.rounds += 1
        self.rounds_by_method[method] = self.rounds_by_method.get(method, 0) + 1
        if drafted == 0:
            return
        self.drafted += drafted
        self.accepted += accepted
        self.drafted_by_method[method] = self.drafted_by_method.get(method, 0) + drafted
        self.accepted_by_method[method] = self.accepted_by_method.get(method, 0) + accepted
        while len(self.per_position_drafted) < drafted:
            self.per_position_drafted.append(0)
            self.per_position_accepted.append(0)
        for i in range(judged(drafted, accepted)):
            self.per_position_drafted[i] += 1
            if i < accepted:
                self.per_position_accepted[i] += 1

    @classmethod
    def pooled(cls, generations: Iterable[GenerationStats]) -> GenerationStats:
        """Counts and times of several generations added up, so figures pooled over runs use the same rules."""
        total = cls()
        for s in generations:
            for name in ("prompt_tokens", "prefill_tokens", "generated_tokens", "rounds", "drafted", "accepted",
                         "prefill_s", "draft_s", "verify_s", "overhead_s", "rollback_s", "replayed_tokens"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
            for mine, theirs in ((total.drafted_by_method, s.drafted_by_method),
                                 (total.accepted_by_method, s.accepted_by_method),
                                 (total.rounds_by_method, s.rounds_by_method)):
                for method, n in theirs.items():
                    mine[method] = mine.get(method, 0) + n
            for mine, theirs in ((total.per_position_drafted, s.per_position_drafted),
                                 (total.per_position_accepted, s.per_position_accepted)):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, n in enumerate(theirs):
                    mine[i] += n
        return total

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target pass (accepted drafts plus the target's own token)."""
        return self.generated_tokens / self.rounds if self.rounds else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.per_position_accepted, self.per_position_drafted)]

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
            "target_passes": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 3),
            "per_position_acceptance": [round(x, 4) for x in self.per_position_acceptance],
            "per_position_drafted": list(self.per_position_drafted),
            "by_method": {
                m: {
                    "rounds": self.rounds_by_method.get(m, 0),
                    "drafted": self.drafted_by_method.get(m, 0),
                    "accepted": self.accepted_by_method.get(m, 0),
                }
                for m in sorted(self.rounds_by_method)
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
        }


def summary_line(stats: GenerationStats) -> str:
    """One line of figures for the end of an answer."""
    parts = [
        f"{stats.generated_tokens} tokens",
        f"{stats.decode_tok_per_s:.1f} tok/s",
        f"{stats.rounds} target passes",
    ]
    if stats.drafted:
        by_method = ", ".join(
            f"{m} {stats.accepted_by_method.get(m, 0)}/{n}" for m, n in sorted(stats.drafted_by_method.items())
        )
        parts.append(f"accepted {stats.acceptance_rate:.0%} ({by_method})")
        parts.append(f"{stats.mean_accepted_length:.2f} tokens/pass")
    parts.append(f"prefill {stats.prefill_tokens} tok in {stats.prefill_s:.2f}s")
    if stats.replayed_tokens:
        parts.append(f"{stats.replayed_tokens} tokens replayed ({stats.rollback_s:.2f}s on rollbacks)")
    parts.append(f"stop: {stats.stop_reason}")
    parts.append(f"{stats.kernels} kernels")
    return " | ".join(parts)
