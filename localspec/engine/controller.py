"""Picks, every round, the method and draft length with the highest expected tokens per second.

Every cost is measured: a target pass per batch size, a draft-model step, the draft model's catch-up
(before drafting it evaluates every token since its last use, the whole context the first time) and the
Python overhead per round. Acceptance is a running estimate per proposer (per n-gram match length for
prompt lookup). With acceptance a_i for draft token i given the ones before it (a constant a for the
draft model; for lookup, the estimate for the match that token continues), drafting k tokens yields
1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens for one target pass of k + 1 tokens plus k draft steps;
"none" yields one token for a pass of one. Where nothing beats "none", it does not speculate.

A draft model's catch-up (and, the first time, its loading) is paid once and repaid by the rounds after
it, so in ``auto`` the draft is used only when its saving per token over the answer's expected remaining
length exceeds that cost. Once
its measured costs show it cannot beat the target alone even at a hopeful acceptance, ``auto`` leaves it
off for the session and ``draft_status`` says why.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Callable, Mapping, Sequence
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
# Until a batch size is measured, assume each extra token adds this share of a one-token pass. A 2-core
# CPU pays about a third of a pass per extra token in small batches; erring high keeps the first rounds
# of an answer from probing at a loss, and a size in use is measured after one round.
PRIOR_BATCH_SLOPE = 0.35
MIN_SLOPE_BATCH = 4
# Prior acceptance per drafted token, and how many rounds' worth of belief the prior carries.
# Keyed by match length (4 stands for 4-7): a match of 8 tokens or more is a copy in progress, the
# likelier to go on the longer it has run. Each draft position is judged by the match it continues
# (position i of a draft after an m-token match continues an m + i match), so one long draft is valued
# as a copy that firms up as it runs. Chosen by replay on the shipped workloads' greedy answers
# (scripts/replay_lookup.py): code-edit 2.14x -> 2.20x at 192 tokens, geometric mean over slices and
# answer lengths 1.338 -> 1.358; measured side by side in lockstep, summarize gained most.
PRIOR_LOOKUP_ACCEPTANCE = {1: 0.2, 2: 0.35, 3: 0.5, 4: 0.65, 8: 0.85, 16: 0.95, 32: 0.98, 64: 0.99}
PRIOR_DRAFT_ACCEPTANCE = 0.6
# Suffix decoding (engine/suffix.py) copies earlier answers, priced like lookup by the length of the match
# its occurrences share with the context, but from a store that holds other requests' answers: a short
# match there is likelier chance than in the current conversation, so its priors start lower.
PRIOR_SUFFIX_ACCEPTANCE = {1: 0.1, 4: 0.4, 8: 0.7, 16: 0.85, 32: 0.95}
# The sources that draft by copying, each with an acceptance estimate per match length.
COPY_PRIORS = {"lookup": PRIOR_LOOKUP_ACCEPTANCE, "suffix": PRIOR_SUFFIX_ACCEPTANCE}
PRIOR_WEIGHT = 3.0
# Lookup observations fade each round, so an estimate follows the text and an option written off long
# ago drifts back toward its prior and gets tried again (a lookup probe costs one short pass). The draft
# model's estimate fades only as it is used: trying it again costs a catch-up.
FORGET = 0.98
COST_EMA = 0.3
# Pass costs are the median of the last few measurements: one pass slowed by another process on a
# shared machine must not write off a batch size for the rest of the answer.
COST_WINDOW = 7
# A batch size with fewer samples than this is not yet trusted.
TRUSTED_SAMPLES = 3
# An answer that has run n tokens is expected to run about n more (at least this many, at most the budget).
MIN_EXPECTED_REMAINING = 32
# The draft model is switched off once it loses to the target alone even at its acceptance estimate plus
# this many standard deviations.
HOPEFUL_SIGMAS = 2.0


@dataclass(frozen=True)
class Plan:
    method: str  # "none", "lookup", "suffix" or "draft"
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

    @property
    def hopeful(self) -> float:
        """The rate plus HOPEFUL_SIGMAS standard deviations: what it might still turn out to be."""
        rate = self.rate
        return min(1.0, rate + HOPEFUL_SIGMAS * math.sqrt(rate * (1.0 - rate) / (PRIOR_WEIGHT + self.judged)))

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
            e.g. the ratio of the model file sizes; also scales the prior for the draft's catch-up.
        draft_load_s: seconds loading the draft model will take, charged to its first use.
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
        draft_load_s: float = 0.0,
        rollback_window: int | None = None,
        speculation_off: str | None = None,
    ) -> None:
        self.has_draft_model = has_draft_model
        # A recurrent target removes at most this many rejected drafts in place (None: any, a KV cache);
        # a longer draft pays a checkpoint, and on a partial acceptance a restore and a replay.
        self.rollback_window = rollback_window
        self.speculation_off = speculation_off  # why this target cannot speculate at all
        self.draft_cost_ratio = draft_cost_ratio
        self.draft_load_s = draft_load_s
        self._limits = (lookup_max, draft_max)
        self.configure(method, draft_len)
        # One-token passes in seconds; larger passes relative to the one-token cost of their time, so a
        # spell when another process slows the machine leaves no stale absolute cost for sizes that are
        # then no longer in use.
        self._pass_samples: dict[int, deque[float]] = {}
        self._one: float | None = None
        self._relative: dict[int, float] = {}
        self._sizes: list[int] = []  # the measured batch sizes, sorted
        self._unscaled: list[tuple[int, float]] = []  # passes measured before any one-token pass
        self._draft_step: float | None = None
        self._catch_up_per_token: float | None = None
        self._overhead = 0.0
        self._checkpoint_s: float | None = None  # saving a recurrent state; free until first measured
        self._restore_s: float | None = None  # restoring one, beyond the replay pass itself
        self._copies = {
            source: {bucket: _Acceptance(a) for bucket, a in priors.items()} for source, priors in COPY_PRIORS.items()
        }
        # planning looks one up per draft position, so by bisection
        self._buckets = {source: sorted(estimates) for source, estimates in self._copies.items()}
        self._draft = _Acceptance(PRIOR_DRAFT_ACCEPTANCE)
        self.draft_off: str | None = None  # why auto no longer uses the draft model, once it has given up
        self._draft_declined: str | None = None  # why auto passed over the draft model last time

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
        if batch_size != 1:
            if self._one is None:
                self._unscaled.append((batch_size, seconds))
            else:
                self._add_sample(batch_size, seconds / self._one)
            return
        self._one = self._add_sample(1, seconds)
        self._relative[1] = 1.0
        for batch, unscaled in self._unscaled:
            self._add_sample(batch, unscaled / self._one)
        self._unscaled.clear()

    def _add_sample(self, batch_size: int, value: float) -> float:
        samples = self._pass_samples.setdefault(batch_size, deque(maxlen=COST_WINDOW))
        samples.append(value)
        if batch_size not in self._relative:
            self._sizes = sorted((*self._relative, batch_size))
        median = self._relative[batch_size] = statistics.median(samples)
        return median

    def remember(self, relative: Mapping[int, float]) -> None:
        """Seed pass costs (relative to a one-token pass) measured in earlier sessions on this machine.

        Each counts as a trusted measurement until passes of its size in this session outvote it.
        """
        for batch_size, value in relative.items():
            if 1 < batch_size <= MAX_VERIFY_BATCH and batch_size not in self._relative:
                for _ in range(TRUSTED_SAMPLES):
                    self._add_sample(batch_size, value)

    def relative_costs(self) -> dict[int, float]:
        """Trusted verification pass costs relative to a one-token pass, for ``remember`` next session."""
        return {
            batch_size: value
            for batch_size, value in self._relative.items()
            if 1 < batch_size <= MAX_VERIFY_BATCH and len(self._pass_samples[batch_size]) >= TRUSTED_SAMPLES
        }

    def _measured(self, batch_size: int) -> float:
        return self._one * self._relative[batch_size]

    def record_draft(self, catch_up_tokens: int, catch_up_s: float, steps: int, steps_s: float) -> None:
        """One round of the draft model: a catch-up batch (0 tokens when it was in step), then its steps."""
        self.draft_load_s = 0.0  # loaded now
        if catch_up_tokens:
            self._catch_up_per_token = _ema(self._catch_up_per_token, catch_up_s / catch_up_tokens)
        if steps:
            self._draft_step = _ema(self._draft_step, steps_s / steps)

    def record_checkpoint(self, seconds: float) -> None:
        self._checkpoint_s = _ema(self._checkpoint_s, seconds)

    def record_restore(self, seconds: float, replayed: int) -> None:
        """A restored checkpoint and the ``replayed`` tokens evaluated again on it; the replay itself is
        priced as a pass of that size, so only the rest is kept."""
        replay = self.pass_cost(replayed) or 0.0
        self._restore_s = _ema(self._restore_s, max(0.0, seconds - replay))

    def record_overhead(self, seconds: float) -> None:
        self._overhead += COST_EMA * (seconds - self._overhead)

    def record_round(self, source: str, match_len: int, drafted: int, accepted: int) -> None:
        for estimates in self._copies.values():
            for estimate in estimates.values():
                estimate.forget()
        if source == "draft":
            self._draft.forget()
        if drafted and source in COPY_PRIORS:
            # Draft position i continues a match of match_len + i tokens if the ones before it held.
            for i in range(judged(drafted, accepted)):
                self._estimate(source, match_len + i).record(1, int(i < accepted))
        elif drafted:
            self._estimate(source, match_len).record(drafted, accepted)
        if source == "draft" and self.method == "auto" and self.draft_off is None:
            self._check_draft()

    def _estimate(self, source: str, match_len: int) -> _Acceptance:
        if source in COPY_PRIORS:
            buckets = self._buckets[source]
            return self._copies[source][buckets[bisect.bisect_right(buckets, max(1, match_len)) - 1]]
        return self._draft

    def acceptance(self, source: str, match_len: int = 1) -> float:
        return self._estimate(source, match_len).rate

    def pass_cost(self, batch_size: int) -> float | None:
        """Measured seconds for a target pass, or an estimate for an unmeasured size.

        From the measured size below, the cost grows at the slope measured up to it (the prior slope
        before there is one); that slope is trusted up to twice the size, and beyond, toward the next
        measured size, the cost follows a straight line to it (a large pass, usually a prefill, is
        cheaper per token: kernels switch, fixed costs spread). Erring high near measured sizes keeps
        short drafts from probing at a loss; erring low far from them lets long drafts be tried, and a
        size in use is measured after one round.
        """
        one = self._one
        if one is None:
            return None
        measured = self._measured(batch_size) if batch_size in self._relative else None
        if measured is not None and (batch_size == 1 or len(self._pass_samples[batch_size]) >= TRUSTED_SAMPLES):
            return measured
        estimate = self._estimate_pass(batch_size, one)
        # A size measured once or twice may have been slowed by another process: a guess from the other
        # sizes keeps it in use until more samples settle it.
        return estimate if measured is None else min(measured, estimate)

    def _estimate_pass(self, batch_size: int, one: float) -> float:
        sizes = self._sizes
        i = bisect.bisect_left(sizes, batch_size)
        below = sizes[i - 1]
        if i < len(sizes) and sizes[i] == batch_size:
            i += 1
        above = sizes[i] if i < len(sizes) else None
        low = self._measured(below)
        # The step from one token to two is the steepest on a CPU, so it alone does not set the slope.
        slope = PRIOR_BATCH_SLOPE * one
        if below >= MIN_SLOPE_BATCH:
            slope = (low - one) / (below - 1)
        if above is None:
            return low + slope * (batch_size - below)
        high = self._measured(above)
        reach = min(above, 2 * max(below, MIN_SLOPE_BATCH))
        estimate = min(low + slope * (min(batch_size, reach) - below), high)
        if batch_size > reach:
            estimate += (batch_size - reach) / (above - reach) * (high - estimate)
        # Where the measured sizes show costs rising faster than that, the straight line between them.
        return max(estimate, low + (batch_size - below) / (above - below) * (high - low))

    def draft_step_cost(self) -> float | None:
        if self._draft_step is not None:
            return self._draft_step
        return None if self._one is None else self._one * self.draft_cost_ratio

    def catch_up_cost(self, tokens: int) -> float:
        """Seconds the draft model spends on a catch-up batch of ``tokens`` before its steps.

        Until one is measured: the target's per-token cost in its largest measured pass (a prefill,
        usually) scaled by the draft's cost ratio.
        """
        per_token = self._catch_up_per_token
        if per_token is None:
            largest = self._sizes[-1] if self._sizes and self._one is not None else None
            per_token = 0.0 if largest is None else self._measured(largest) / largest * self.draft_cost_ratio
        return tokens * per_token

    def costs(self) -> dict:
        """The controller's current beliefs, for stats and the live view."""
        return {
            # Remembered sizes are relative to a one-token pass, which a fixed draft length never times.
            "pass_s": {} if self._one is None else {b: round(self._measured(b), 5) for b in self._sizes},
            "draft_step_s": None if self._draft_step is None else round(self._draft_step, 5),
            "draft_catch_up_s_per_token": None
            if self._catch_up_per_token is None
            else round(self._catch_up_per_token, 6),
            "overhead_s": round(self._overhead, 5),
            "checkpoint_s": None if self._checkpoint_s is None else round(self._checkpoint_s, 5),
            "restore_s": None if self._restore_s is None else round(self._restore_s, 5),
            "lookup_acceptance": {b: round(e.rate, 3) for b, e in self._copies["lookup"].items()},
            "suffix_acceptance": {b: round(e.rate, 3) for b, e in self._copies["suffix"].items()},
            "draft_acceptance": round(self._draft.rate, 3),
        }

    def draft_status(self) -> str | None:
        """Why ``auto`` does or does not use the draft model, in one line; None without a draft model."""
        if self.speculation_off is not None:
            return f"no speculation on this target: {self.speculation_off}"
        if not self.has_draft_model:
            return None
        if self.method in DRAFT_MODEL_METHODS:
            return f"in use: --method {self.method}"
        if self.method != "auto":
            return f"not used: --method {self.method}"
        if self.draft_off is not None:
            return f"off for this session: {self.draft_off}"
        return self._draft_declined or "in use: expected to beat the target alone at the latest choice"

    # -- decisions -------------------------------------------------------------------------------
    def _copy_rates(self, source: str, match_len: int, k_max: int) -> list[float]:
        """Acceptance per draft position: position i continues a match of ``match_len + i`` tokens, so a
        copy in progress is expected to run on longer the further it has already run."""
        return [self.acceptance(source, match_len + i) for i in range(k_max)]

    def _best(self, source: str, rates: Sequence[float], step_cost: float) -> Plan | None:
        """The k with the highest expected rate; ``rates[i]``: P(draft token i accepted | those before were)."""
        best = None
        tokens, reach = 1.0, 1.0
        window = self.rollback_window
        restore = 0.0  # expected restore-and-replay seconds, should the draft be rolled back from a checkpoint
        for k, rate_i in enumerate(rates, start=1):
            if window is not None:
                # k - 1 drafts accepted, the k-th rejected: replay the last token and those k - 1.
                restore += reach * (1.0 - rate_i) * ((self._restore_s or 0.0) + self.pass_cost(k))
            reach *= rate_i
            tokens += reach
            pass_cost = self.pass_cost(k + 1)
            if window is not None and k > window:
                pass_cost += (self._checkpoint_s or 0.0) + restore
            rate = tokens / (pass_cost + k * step_cost + self._overhead)
            if best is None or rate > best.expected_rate:
                best = Plan(source, k, tokens, rate)
        return best

    def _none_rate(self) -> float:
        return 1.0 / (self._one + self._overhead)

    def _check_draft(self) -> None:
        """Give the draft model up for the session once its measured costs show it cannot pay."""
        step = self._draft_step
        if step is None:
            return
        hopeful = self._draft.hopeful
        best = self._best("draft", [hopeful] * self.draft_max, step)
        none = self._none_rate()
        if best.expected_rate <= none:
            self.draft_off = (
                f"a draft step costs {step / self._one:.2f} of a target step (measured), so even "
                f"at {hopeful:.0%} acceptance drafting would run at {best.expected_rate / none:.2f}x the target alone"
            )

    def _draft_option(self, rival: Plan, catch_up: Callable[[], int], expected_remaining: float) -> Plan | None:
        """The draft plan for auto if it beats ``rival`` this round and repays its catch-up; else None,
        with the reason kept for ``draft_status``."""
        step = self.draft_step_cost()
        best = self._best("draft", [self._draft.rate] * self.draft_max, step)
        measured = "measured" if self._draft_step is not None else "expected"
        none = self._none_rate()
        if best.expected_rate <= rival.expected_rate:
            if best.expected_rate > none:
                self._draft_declined = "not used at the latest choice: prompt lookup was expected to do better"
                return None
            self._draft_declined = (
                f"not used: at {self._draft.rate:.0%} acceptance and a step of "
                f"{step / self._one:.2f} target steps ({measured}), drafting would run at "
                f"{best.expected_rate / none:.2f}x the target alone"
            )
            return None
        saving = expected_remaining * (1.0 / none - 1.0 / best.expected_rate)
        tokens = catch_up()
        cost = self.catch_up_cost(tokens) + self.draft_load_s
        if cost >= saving:
            loading = "loading it and " if self.draft_load_s else ""
            self._draft_declined = (
                f"not used: {loading}catching up on {tokens} tokens would cost {cost:.2f} s, more than the "
                f"{saving:.2f} s it could save over the rest of the answer"
            )
            return None
        self._draft_declined = None
        return best

    def plan(
        self,
        *,
        lookup_available: int,
        lookup_match_len: int,
        draft_catch_up: Callable[[], int] = lambda: 0,
        generated: int = 0,
        remaining: int | None = None,
        suffix_available: int = 0,
        suffix_match_len: int = 0,
    ) -> Plan:
        """Choose this round's plan.

        Args:
            lookup_available: how many tokens prompt lookup can draft now.
            lookup_match_len: the length of the match those tokens continue.
            draft_catch_up: gives the tokens the draft model would evaluate before drafting (the whole
                context before its first use); called only when the draft model is in question.
            generated, remaining: tokens of the answer so far and left in its budget (None: unbounded).
            suffix_available, suffix_match_len: the same for suffix decoding's draft (``auto`` only).
        """
        method = self.method
        lookup_k = min(lookup_available, self.lookup_max)
        if method == "none" or (method == "lookup" and lookup_k == 0) or self.speculation_off is not None:
            return Plan("none", 0, 1.0, 0.0)
        if self.draft_len is not None and method != "auto":
            if method == "lookup" or (method == "hybrid" and lookup_k > 0):
                return Plan("lookup", lookup_k, 0.0, 0.0)
            return Plan("draft", self.draft_len, 0.0, 0.0)
        if len(self._pass_samples.get(1, ())) < TRUSTED_SAMPLES:
            # Every choice is priced against a one-token pass, so measure a few first (one alone may have
            # been slowed by another process, or by the first pass after a prefill).
            return Plan("none", 0, 1.0, 0.0)

        options: list[Plan] = []
        if method == "auto":
            options.append(Plan("none", 0, 1.0, self._none_rate()))
        if lookup_k > 0 and method in ("lookup", "hybrid", "auto"):
            options.append(self._best("lookup", self._copy_rates("lookup", lookup_match_len, lookup_k), 0.0))
        suffix_k = min(suffix_available, self.lookup_max)
        if suffix_k > 0 and method == "auto":
            options.append(self._best("suffix", self._copy_rates("suffix", suffix_match_len, suffix_k), 0.0))
        if method == "draft" or (method == "hybrid" and lookup_k == 0):
            options.append(self._best("draft", [self._draft.rate] * self.draft_max, self.draft_step_cost()))
        best = max(options, key=lambda plan: plan.expected_rate)
        if method == "auto" and self.has_draft_model and self.draft_off is None:
            expected = max(generated, MIN_EXPECTED_REMAINING)
            if remaining is not None:
                expected = min(expected, remaining)
            best = self._draft_option(best, draft_catch_up, expected) or best
        return best


def _ema(old: float | None, sample: float) -> float:
    return sample if old is None else old + COST_EMA * (sample - old)
