"""Picks, every round, the method and draft length with the highest expected tokens per second.

It measures what a target pass costs for each batch size, what a draft-model step costs and the
Python overhead per round, and keeps a running acceptance estimate per proposer (per n-gram match
length for prompt lookup). With acceptance a per drafted token (geometric model), drafting k tokens
yields 1 + a + a^2 + ... + a^k tokens for one target pass of k + 1 tokens plus k draft steps; "none"
yields one token for a pass of one. Where nothing beats "none", it does not speculate.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass

from localspec.engine.backend import MAX_VERIFY_BATCH
from localspec.engine.stats import judged
from localspec.errors import UsageError

METHODS = ("none", "draft", "lookup", "hybrid", "auto")
DEFAULT_METHOD = "auto"
DRAFT_MODEL_METHODS = ("draft", "hybrid")
DEFAULT_LOOKUP_MAX = 64
MAX_DRAFT_LEN = MAX_VERIFY_BATCH - 1  # a verification is the last token plus the drafts
DEFAULT_DRAFT_MAX = 16
# Until a batch size is measured, assume each extra token adds this share of a one-token pass
# (slightly optimistic: a wrong guess is measured and corrected after one round).
PRIOR_BATCH_SLOPE = 0.2
MIN_SLOPE_BATCH = 4
# Prior acceptance per drafted token, and how many rounds' worth of belief the prior carries.
# Keyed by match length (4 stands for 4-7): a match of 8 tokens or more is a copy in progress, the
# likelier to go on the longer it has run.
PRIOR_LOOKUP_ACCEPTANCE = {1: 0.2, 2: 0.35, 3: 0.5, 4: 0.65, 8: 0.85, 16: 0.92, 32: 0.96}
PRIOR_DRAFT_ACCEPTANCE = 0.6
PRIOR_WEIGHT = 3.0
# Observations fade each round, so an estimate follows the text and an option written off long ago
# drifts back toward its prior and gets tried again.
FORGET = 0.98
COST_EMA = 0.3
# Pass costs are the median of the last few measurements: one pass slowed by another process on a
# shared machine must not write off a batch size for the rest of the answer.
COST_WINDOW = 7


@dataclass(frozen=True)
class Plan:
    method: str  # "none", "lookup" or "draft"
    k: int  # tokens to draft (0 for "none")
    expected_tokens: float
    expected_rate: float  # tokens per second, 0 when costs are not yet known


class _Acceptance:
    """Beta-style estimate of P(a drafted token is accepted | the ones before it were)."""

    def __init__(self, prior: float) -> None:
        self.prior = prior
        self.accepted = 0.0
        self.judged = 0.0

    @property
    def rate(self) -> float:
        return (self.prior * PRIOR_WEIGHT + self.accepted) / (PRIOR_WEIGHT + self.judged)

    def record(self, drafted: int, accepted: int) -> None:
        self.accepted += accepted
        self.judged += judged(drafted, accepted)

    def forget(self) -> None:
        self.accepted *= FORGET
        self.judged *= FORGET


def check_method(method: str, *, has_draft_model: bool | None = None, given_as: str = "method") -> str:
    """The one check of a method name, and (when ``has_draft_model`` is known) that it can run.

    ``given_as`` names where the user wrote it (``--method``, ``/method``), so the error points there.
    """
    if method not in METHODS:
        raise UsageError(f"unknown {given_as} {method!r}; use one of {', '.join(METHODS)}")
    if has_draft_model is False and method in DRAFT_MODEL_METHODS:
        raise UsageError(f"{given_as} {method} needs a draft model: pass --draft PATH or use --profile")
    return method


def expected_tokens(acceptance: float, k: int) -> float:
    """Tokens one round yields when drafting k tokens, each accepted with probability ``acceptance``."""
    if acceptance >= 1.0:
        return k + 1.0
    return 1.0 + acceptance * (1.0 - acceptance**k) / (1.0 - acceptance)


class Controller:
    """Chooses a ``Plan`` per round from measured costs; see the module docstring for the model.

    Args:
        method: one of METHODS; fixed methods still let the controller pick k unless ``draft_len`` is set.
        draft_len: fixed draft length, or None to let the controller choose (capped by it in "auto").
        draft_cost_ratio: prior for (draft step time / one-token target pass) before it is measured,
            e.g. the ratio of the model file sizes.
    """

    def __init__(
        self,
        method: str = DEFAULT_METHOD,
        *,
        draft_len: int | None = None,
        has_draft_model: bool = False,
        draft_cost_ratio: float = 0.5,
        lookup_max: int = DEFAULT_LOOKUP_MAX,
        draft_max: int = DEFAULT_DRAFT_MAX,
    ) -> None:
        self.has_draft_model = has_draft_model
        self.draft_cost_ratio = draft_cost_ratio
        self._limits = (lookup_max, draft_max)
        self.configure(method, draft_len)
        self._pass_samples: dict[int, deque[float]] = {}
        self._pass_cost: dict[int, float] = {}
        self._draft_step: float | None = None
        self._overhead = 0.0
        self._lookup = {bucket: _Acceptance(a) for bucket, a in PRIOR_LOOKUP_ACCEPTANCE.items()}
        self._draft = _Acceptance(PRIOR_DRAFT_ACCEPTANCE)

    def configure(self, method: str, draft_len: int | None) -> None:
        """Switch method or draft length mid-session; measured costs and acceptance are kept."""
        check_method(method, has_draft_model=self.has_draft_model)
        if draft_len is not None and not 1 <= draft_len <= MAX_DRAFT_LEN:
            raise UsageError(f"draft length must be between 1 and {MAX_DRAFT_LEN}, got {draft_len}")
        lookup_max, draft_max = self._limits
        self.method = method
        self.draft_len = draft_len
        self.lookup_max = lookup_max if draft_len is None else draft_len
        self.draft_max = draft_max if draft_len is None else draft_len

    # -- measurements ----------------------------------------------------------------------------
    def record_pass(self, batch_size: int, seconds: float) -> None:
        samples = self._pass_samples.setdefault(batch_size, deque(maxlen=COST_WINDOW))
        samples.append(seconds)
        self._pass_cost[batch_size] = statistics.median(samples)

    def record_draft_step(self, steps: int, seconds: float) -> None:
        if steps <= 0:
            return
        per_step = seconds / steps
        old = self._draft_step
        self._draft_step = per_step if old is None else old + COST_EMA * (per_step - old)

    def record_overhead(self, seconds: float) -> None:
        self._overhead += COST_EMA * (seconds - self._overhead)

    def record_round(self, source: str, match_len: int, drafted: int, accepted: int) -> None:
        for estimate in (*self._lookup.values(), self._draft):
            estimate.forget()
        if drafted:
            self._estimate(source, match_len).record(drafted, accepted)

    def _estimate(self, source: str, match_len: int) -> _Acceptance:
        if source == "lookup":
            return self._lookup[max(b for b in self._lookup if b <= max(1, match_len))]
        return self._draft

    def acceptance(self, source: str, match_len: int = 1) -> float:
        return self._estimate(source, match_len).rate

    def pass_cost(self, batch_size: int) -> float | None:
        """Measured (or, for unmeasured sizes, interpolated or extrapolated) seconds for a target pass."""
        if batch_size in self._pass_cost:
            return self._pass_cost[batch_size]
        one = self._pass_cost.get(1)
        if one is None:
            return None
        sizes = sorted(self._pass_cost)
        below = max((b for b in sizes if b < batch_size), default=1)
        above = min((b for b in sizes if b > batch_size), default=None)
        if above is not None:
            frac = (batch_size - below) / (above - below)
            return self._pass_cost[below] + frac * (self._pass_cost[above] - self._pass_cost[below])
        # Beyond the largest measured size: the slope seen so far, or the prior until there is one.
        # The step from one token to two is the steepest on a CPU, so it alone does not set the slope.
        slope = PRIOR_BATCH_SLOPE * one
        if below >= MIN_SLOPE_BATCH:
            slope = max(slope, (self._pass_cost[below] - one) / (below - 1))
        return self._pass_cost[below] + slope * (batch_size - below)

    def draft_step_cost(self) -> float | None:
        if self._draft_step is not None:
            return self._draft_step
        one = self._pass_cost.get(1)
        return None if one is None else one * self.draft_cost_ratio

    def costs(self) -> dict:
        """The controller's current beliefs, for stats and the live view."""
        return {
            "pass_s": {b: round(s, 5) for b, s in sorted(self._pass_cost.items())},
            "draft_step_s": None if self._draft_step is None else round(self._draft_step, 5),
            "overhead_s": round(self._overhead, 5),
            "lookup_acceptance": {b: round(e.rate, 3) for b, e in self._lookup.items()},
            "draft_acceptance": round(self._draft.rate, 3),
        }

    # -- decisions -------------------------------------------------------------------------------
    def _best(self, source: str, acceptance: float, k_max: int, step_cost: float) -> Plan | None:
        best = None
        for k in range(1, k_max + 1):
            pass_cost = self.pass_cost(k + 1)
            tokens = expected_tokens(acceptance, k)
            rate = tokens / (pass_cost + k * step_cost + self._overhead)
            if best is None or rate > best.expected_rate:
                best = Plan(source, k, tokens, rate)
        return best

    def plan(self, *, lookup_available: int, lookup_match_len: int) -> Plan:
        """Choose this round's plan; ``lookup_available`` is how many tokens prompt lookup can draft now."""
        method = self.method
        lookup_k = min(lookup_available, self.lookup_max)
        if method == "none" or (method == "lookup" and lookup_k == 0):
            return Plan("none", 0, 1.0, 0.0)
        one = self.pass_cost(1)
        if self.draft_len is not None and method != "auto":
            if method == "lookup" or (method == "hybrid" and lookup_k > 0):
                return Plan("lookup", lookup_k, 0.0, 0.0)
            return Plan("draft", self.draft_len, 0.0, 0.0)
        if one is None:
            # Every choice is priced against a one-token pass, so measure one first.
            return Plan("none", 0, 1.0, 0.0)

        options: list[Plan] = []
        if method == "auto":
            options.append(Plan("none", 0, 1.0, 1.0 / (one + self._overhead)))
        if lookup_k > 0 and method in ("lookup", "hybrid", "auto"):
            options.append(self._best("lookup", self.acceptance("lookup", lookup_match_len), lookup_k, 0.0))
        use_draft = method == "draft" or (method == "hybrid" and lookup_k == 0)
        if use_draft or (method == "auto" and self.has_draft_model):
            options.append(self._best("draft", self._draft.rate, self.draft_max, self.draft_step_cost()))
        return max(options, key=lambda plan: plan.expected_rate)
