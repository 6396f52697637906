"""The planner: every round, of the drafters' offers, the one and the draft length with the highest
expected tokens per second.

Costs are measured (costs.py), acceptance is a running estimate per drafter (estimates.py): drafting k
tokens yields ``expected_tokens`` for one target pass of k + 1 tokens plus, for a model drafter, k draft
steps; the target alone yields one token for a pass of one.

A copy drafter's offer is judged every round it is made, drafted from or not: the tokens the round
emitted say how much of it the target would have accepted (greedy, exactly; sampling, in expectation,
as a copied token is accepted with probability p(x), the chance the target emits x). So copy estimates
follow the text at no cost, and an answer that copies badly stops drafting after its first few offers
rather than after its first few failed drafts.

A copy bet whose edge is within what its estimates are unsure of (it would not beat the target alone
with every estimate ``CAUTION_SIGMAS`` standard deviations lower) is cut to one token: its stake is then
one row more in the pass. Refused outright, such bets lost more than they saved where the curve is flat
(on the 2-core Intel Xeon, where a 2-row pass costs 1.07 one-row passes, short copies of chat came true
twice as often as their estimate after a run of failures, and refusing them cost chat 4-7% against lookup
in bench); drafted whole, long ones after medium matches lost where it is steep (SmolLM2's new code, a
2-row pass at 1.5: 0.95x of the target alone, against 0.99-1.02x with them refused).

Where nothing beats the target alone, it does not speculate, except for a bounded exploration: a copy
drafter whose estimate may be too low (its hopeful rate would pay: few offers of that match length seen)
is tried with a short draft while what such probes lost in this answer (net of what they gained) stays
under ``EXPLORE_SHARE`` of the time the target alone would have taken for its tokens so far. A probe
also measures the pass it needs, which the cost curve of a new machine has not yet seen.

A drafting round that follows one-token passes is charged the return to them as well: the one-token passes
after a larger one run slower for a while (``Costs.return_s``; on SmolLM2-135M on the 2-core Intel Xeon
0.3-0.6 of a pass, which made its one-token bets lose where their passes alone said they paid). Rounds
drafting one after another pay it once, when they stop, so within a run of them it is not charged.

A model drafter's catch-up (and, the first time, its loading) is paid once and repaid by the rounds after
it, so in ``auto`` it is used only when its saving per token over the answer's expected remaining length
exceeds that cost. Once its measured costs show it cannot beat the target alone even at a hopeful
acceptance, ``auto`` leaves it off for the session and ``draft_status`` says why. One that cannot beat the
target alone at its estimate is priced again only when the target's pass curve changes or after
``REPRICE_ROUNDS``: unused, its estimate and step cost stay as they were.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from localspec.engine.decoding.stats import Idle
from localspec.engine.drafters.base import COPY, FORCED, MAX_COPY_DRAFT, MODEL, TARGET_ALONE, Offer
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.drafters.registry import AUTO, DEFAULT_METHOD, DRAFTERS, check_method, uses
from localspec.engine.llama.kernels import MAX_VERIFY_BATCH
from localspec.engine.planner.costs import (
    DEFAULT_DRAFT_COST_RATIO,
    TRUSTED_SAMPLES,
    Costs,
    ModelDrafterCosts,
    RoundOverheads,
)
from localspec.engine.planner.estimates import (
    HOPEFUL_SIGMAS,
    Acceptance,
    MatchAcceptance,
    expected_tokens,
    running_expected_tokens,
)
from localspec.engine.tokens import common_prefix_length
from localspec.errors import UsageError

MAX_DRAFT_LEN = MAX_VERIFY_BATCH - 1  # a verification is the last token plus the drafts
DEFAULT_DRAFT_MAX = 16
# An answer that has run n tokens is expected to run about n more (at least this many, at most the budget).
MIN_EXPECTED_REMAINING = 32
# Exploration may lose at most this share of the time the target alone would take for an answer's tokens.
# Half of it was tried: bench --quick's completion slice (which follows new code, whose copies fail) then
# ran at 0.88-0.96x of lookup in 4 runs of 4 on the 2-core Intel Xeon, 1.01x with this share.
EXPLORE_SHARE = 0.01
# A model drafter that cannot beat the target alone is priced again after this many rounds, or sooner when
# the target's pass curve changes: unused, its acceptance and step costs stay as they were, and only the
# target's one-token pass and round overheads, which drift slowly, move its price in between.
REPRICE_ROUNDS = 16
# A copy bet that would lose with its acceptance estimates this many standard deviations lower is cut to one
# token.
CAUTION_SIGMAS = 0.5
# A probe drafts at most this many tokens: it measures the short match it starts from, at little cost.
PROBE_MAX = 4


@dataclass(slots=True)
class Plan:
    source: str  # the drafter's source to draft from, or TARGET_ALONE
    k: int  # tokens to draft (0 for the target alone)
    expected_tokens: float
    expected_rate: float  # tokens per second, 0 when costs are not yet known
    offer: Offer | None = None
    explored: bool = False  # a probe of a drafter whose estimate may be too low
    idle: Idle | None = None  # for the target alone: why


def _target_only(why: Idle, rate: float = 0.0) -> Plan:
    return Plan(TARGET_ALONE, 0, 1.0, rate, idle=why)


def _drafting_seconds(costs: Costs, k: int, step_cost: float, block: bool) -> float:
    """Seconds a model drafter spends drafting ``k`` tokens: ``k`` steps, or for a block drafter one pass of
    k + 1 rows, scaled from a one-row ``step_cost`` as the target's passes scale (``costs``)."""
    return step_cost * costs.pass_cost(k + 1) / costs.one if block else k * step_cost


class _ModelDrafter:
    """What the planner keeps about a model drafter: acceptance, costs, and whether auto gave it up."""

    def __init__(self, prior: float, costs: ModelDrafterCosts, block: bool) -> None:
        self.acceptance = Acceptance(prior)
        self.costs = costs
        self.block = block  # one pass drafts a block: its step is a one-row pass, scaled like the target's
        self.off: str | None = None  # why auto no longer uses it, once it has given up
        self.declined: str | None = None  # why auto passed over it last time
        # When it could not beat the target alone: (the pass curve's version, the draft cap) it was priced
        # at, and the round from which it is priced again whatever they are.
        self.priced_out: tuple[int, int] | None = None
        self.reprice_at = 0


class Controller:
    """Chooses a ``Plan`` per round from the offers; see the module docstring for the model.

    Args:
        method: one of registry.METHODS; fixed methods still let the controller pick k unless ``draft_len``
            is set.
        draft_len: fixed draft length, or None to let the controller choose (capped by it in "auto").
        draft_cost_ratio: prior for (draft step time / one-token target pass) before it is measured.
        draft_load_s: seconds loading the draft model will take, charged to its first use.
        rollback_window: rejected drafts a recurrent target removes in place (None: any, a KV cache); a
            longer draft pays a checkpoint, and on a partial acceptance a restore and a replay.
        speculation_off: why this target cannot speculate at all.
        drafters: the drafter classes whose offers it prices (their ``source``, ``kind`` and ``prior``).
        step_cost_ratios: model drafters that know their own prior step cost (an MTP head from its shapes),
            and need no loading; the others take ``draft_cost_ratio`` and ``draft_load_s``.
        missing: why each drafter that needs something cannot draft, by source (see ``check_method``).
        costs: the target's measured costs, shared with the other controllers on the same target (a bench's
            configurations), or None for costs of its own.
    """

    def __init__(
        self,
        method: str = DEFAULT_METHOD,
        *,
        draft_len: int | None = None,
        has_draft_model: bool = False,
        draft_cost_ratio: float = DEFAULT_DRAFT_COST_RATIO,
        lookup_max: int = MAX_COPY_DRAFT,
        draft_max: int = DEFAULT_DRAFT_MAX,
        draft_load_s: float = 0.0,
        rollback_window: int | None = None,
        speculation_off: str | None = None,
        drafters: Sequence[type] = DRAFTERS,
        step_cost_ratios: Mapping[str, float] = {},
        missing: Mapping[str, str] = {},
        costs: Costs | None = None,
    ) -> None:
        self.has_draft_model = has_draft_model
        self.missing = dict(missing)
        self.rollback_window = rollback_window
        self.speculation_off = speculation_off
        self._limits = (lookup_max, draft_max)
        self.configure(method, draft_len)
        self.costs = Costs() if costs is None else costs
        self.overheads = RoundOverheads()
        self._kinds = {cls.source: cls.kind for cls in drafters}
        self._copies = {cls.source: MatchAcceptance(cls.prior) for cls in drafters if cls.kind == COPY}
        self._models = {
            cls.source: _ModelDrafter(
                cls.prior[1],
                ModelDrafterCosts(step_cost_ratios[cls.source], 0.0)
                if cls.source in step_cost_ratios
                else ModelDrafterCosts(draft_cost_ratio, draft_load_s),
                cls.block,
            )
            for cls in drafters
            if cls.kind == MODEL
        }
        self._answer_tokens = 0  # tokens of the current answer (its exploration budget grows with them)
        self._answer_loss = 0.0  # seconds its probes lost against the target alone
        self._explore_loss = 0.0  # the same over the session
        self._explored = 0  # rounds that probed, over the session
        self._probe_pending = False  # the last plan was a probe: its round's outcome prices it
        self._probe_floor = 0.0  # the cheapest probe's expected loss when none was affordable
        self._copy_offers: list[Offer] = []  # this round's copy offers, judged by what the round emits
        self._planned = 0  # rounds planned, over the session
        self._leaving = 0.0  # what a drafting round pays this round beside its pass: the return (see above)

    def configure(self, method: str, draft_len: int | None) -> None:
        """Switch method or draft length mid-session; measured costs and acceptance are kept."""
        check_method(method, missing=self.missing)
        if draft_len is not None and not 1 <= draft_len <= MAX_DRAFT_LEN:
            raise UsageError(f"draft length must be between 1 and {MAX_DRAFT_LEN}, got {draft_len}")
        lookup_max, draft_max = self._limits
        self.method = method
        self.draft_len = draft_len
        self.lookup_max = lookup_max if draft_len is None else draft_len
        self.draft_max = draft_max if draft_len is None else draft_len

    @property
    def draft_limit(self) -> int:
        """The most tokens any plan drafts: what a drafter's offer need not exceed."""
        return max(self.lookup_max, self.draft_max)

    def allows(self, source: str) -> bool:
        """Whether this method drafts from ``source`` at all (the decoder asks only those for offers)."""
        return self.speculation_off is None and source in self._kinds and uses(self.method, source)

    # -- measurements ----------------------------------------------------------------------------
    def begin_answer(self) -> None:
        """A new answer starts: exploration is budgeted per answer, so no answer pays for another's, and
        what copies did in the last answers counts for less (``Acceptance.carry_over``)."""
        self._answer_tokens, self._answer_loss, self._probe_floor = 0, 0.0, 0.0
        for estimates in self._copies.values():
            estimates.carry_over()

    def record_round(self, source: str, drafted: int, accepted: int, emitted: Sequence[int] = ()) -> None:
        """A round's outcome: ``accepted`` of ``drafted`` tokens from ``source`` (TARGET_ALONE: none), and
        the tokens it ``emitted``, which judge every copy offer the round's plan saw."""
        self._answer_tokens += accepted + 1
        if self._probe_pending:
            self._probe_pending = False
            spent = (self.round_seconds(source, drafted) or 0.0) + self.overheads.of(drafted > 0)
            spent += self._leaving if drafted else 0.0
            # A probe that paid funds the next ones in this answer: a drafter whose prior is wrong here
            # keeps being tried while it pays, and the answer as a whole never loses more than the budget.
            loss = spent - (accepted + 1) / self.target_alone_rate()
            self._answer_loss += loss
            self._explore_loss += loss
        for estimates in self._copies.values():
            estimates.forget()
        for offer in self._copy_offers:
            judged = min(len(offer.tokens), len(emitted))
            self._copies[offer.source].record(offer.match_len, judged, common_prefix_length(offer.tokens, emitted))
        self._copy_offers = []
        model = self._models.get(source)
        if model is not None:
            model.acceptance.forget()
        if not drafted:
            return
        if model is not None:
            model.acceptance.record(drafted, accepted)
            if self.method == AUTO and model.off is None:
                self._check_model(source, model)

    def record_draft(self, source: str, catch_up_tokens: int, catch_up_s: float, steps: int, steps_s: float) -> None:
        """A model drafter's measured work in one round (a block drafter's ``steps``: the rows of its pass)."""
        model = self._models[source]
        if model.block and steps and self.costs.one is not None:
            steps = self.costs.pass_cost(steps) / self.costs.one  # in one-row passes, as the target's curve has it
        model.costs.record(catch_up_tokens, catch_up_s, steps, steps_s)

    def acceptance(self, source: str, match_len: int = 1) -> float:
        if source in self._copies:
            return self._copies[source].rate(match_len)
        return self._models[source].acceptance.rate

    def step_cost(self, source: str) -> float:
        """Seconds one draft token of ``source`` costs (0 for a copy), None before any pass is measured."""
        model = self._models.get(source)
        return 0.0 if model is None else self.costs.step_cost(model.costs)

    def round_seconds(self, source: str, k: int) -> float | None:
        """Seconds a round drafting ``k`` tokens from ``source`` spends in the target pass and the drafter;
        None before a one-token pass is measured."""
        costs = self.costs
        verify = costs.pass_cost(k + 1)
        model = self._models.get(source)
        if verify is None or model is None or not k:
            return verify
        return verify + _drafting_seconds(costs, k, costs.step_cost(model.costs), model.block)

    def beliefs(self) -> dict:
        """The controller's current costs and estimates, for stats and the live view."""
        costs = self.costs
        draft = self._models.get(DraftModelDrafter.source)
        figures = {
            # Remembered sizes are relative to a one-token pass, which a fixed draft length never times.
            "pass_s": {b: round(s, 5) for b, s in costs.measured_passes().items()},
            "draft_step_s": None if draft is None or draft.costs.step_s is None else round(draft.costs.step_s, 5),
            "draft_catch_up_s_per_token": None
            if draft is None or draft.costs.catch_up_per_token is None
            else round(draft.costs.catch_up_per_token, 6),
            "overhead_s": round(self.overheads.alone, 5),
            "drafting_overhead_s": round(self.overheads.of(True), 5),
            "checkpoint_s": None if costs.checkpoint_s is None else round(costs.checkpoint_s, 5),
            "return_s": round(costs.return_s, 5),
            "restore_s": None if costs.restore_s is None else round(costs.restore_s, 5),
            **{f"{source}_acceptance": estimates.summary() for source, estimates in self._copies.items()},
            **{f"{source}_acceptance": round(m.acceptance.rate, 3) for source, m in self._models.items()},
            "explored_rounds": self._explored,
            "exploration_loss_s": round(self._explore_loss, 4),
        }
        return figures

    def draft_status(self) -> str | None:
        """Why ``auto`` does or does not use the draft model, in one line; None without a draft model."""
        if self.speculation_off is not None:
            return f"no speculation on this target: {self.speculation_off}"
        if not self.has_draft_model:
            return None
        if self.method != AUTO:
            in_use = uses(self.method, DraftModelDrafter.source)
            return f"{'in use' if in_use else 'not used'}: method {self.method}"
        model = self._models[DraftModelDrafter.source]
        if model.off is not None:
            return f"off for this session: {model.off}"
        return model.declined or "in use: expected to beat the target alone at the latest choice"

    # -- decisions -------------------------------------------------------------------------------
    def _seconds(self, rates: Sequence[float], step_cost: float, block: bool = False) -> list[float]:
        """Expected seconds of a round drafting k = 1..len(rates) tokens (index k - 1): the target pass,
        the drafting (``_drafting_seconds``), the overhead with the return to one-token passes where this
        round leaves them, and past a recurrent target's snapshots a checkpoint and, should the draft be
        rejected, a restore and a replay."""
        costs, window = self.costs, self.rollback_window
        overhead = self.overheads.of(True) + self._leaving
        if window is None and not step_cost:  # a copy on a KV cache: the pass and the overhead (most rounds)
            one, curve = costs.one, costs.relative_curve(len(rates) + 1)
            return [one * relative + overhead for relative in curve[2 : len(rates) + 2]]
        seconds = []
        reach, restore = 1.0, 0.0
        for k in range(1, len(rates) + 1):
            pass_cost = costs.pass_cost(k + 1)
            if window is not None:
                # k - 1 drafts accepted, the k-th rejected: replay the last token and those k - 1.
                restore += reach * (1.0 - rates[k - 1]) * ((costs.restore_s or 0.0) + costs.pass_cost(k))
                reach *= rates[k - 1]
                if k > window:
                    pass_cost += (costs.checkpoint_s or 0.0) + restore
            seconds.append(pass_cost + _drafting_seconds(costs, k, step_cost, block) + overhead)
        return seconds

    def best_plan(self, source: str, rates: Sequence[float], step_cost: float, offer: Offer | None) -> Plan:
        """The k with the highest expected rate; ``rates[i]``: P(draft token i accepted | those before were)."""
        model = self._models.get(source)
        seconds = self._seconds(rates, step_cost, model is not None and model.block)
        best_k, best_tokens, best_rate = 0, 0.0, -1.0
        for k, (tokens, round_s) in enumerate(zip(running_expected_tokens(rates), seconds), 1):
            if tokens / round_s > best_rate:
                best_k, best_tokens, best_rate = k, tokens, tokens / round_s
        return Plan(source, best_k, best_tokens, best_rate, offer)

    def target_alone_rate(self) -> float:
        """Tokens per second of the target alone, as measured."""
        return 1.0 / (self.costs.one + self.overheads.alone)

    def _check_model(self, source: str, model: _ModelDrafter) -> None:
        """Give a model drafter up for the session once its measured costs show it cannot pay."""
        step = model.costs.step_s
        if step is None:
            return
        hopeful = model.acceptance.hopeful
        best = self.best_plan(source, [hopeful] * self.draft_max, step, None)
        none = self.target_alone_rate()
        if best.expected_rate <= none:
            model.off = (
                f"a draft step costs {step / self.costs.one:.2f} of a target step (measured), so even "
                f"at {hopeful:.0%} acceptance drafting would run at {best.expected_rate / none:.2f}x the target alone"
            )

    def _model_option(self, offer: Offer, rival: Plan, expected_remaining: float) -> Plan | None:
        """The model drafter's plan for auto if it beats ``rival`` this round and repays its catch-up; else
        None, with the reason kept for ``draft_status``."""
        model = self._models[offer.source]
        cap = min(self.draft_max, offer.available)
        priced_at = (self.costs.curve_version, cap)
        if model.priced_out == priced_at and self._planned < model.reprice_at:
            return None  # still cannot beat the target alone (REPRICE_ROUNDS)
        model.priced_out = None
        step = self.costs.step_cost(model.costs)
        rate = model.acceptance.rate
        best = self.best_plan(offer.source, [rate] * cap, step, offer)
        measured = "measured" if model.costs.step_s is not None else "expected"
        none = self.target_alone_rate()
        if best.expected_rate <= rival.expected_rate:
            if best.expected_rate > none:
                model.declined = "not used at the latest choice: prompt lookup was expected to do better"
                return None
            model.priced_out, model.reprice_at = priced_at, self._planned + REPRICE_ROUNDS
            model.declined = (
                f"not used: at {rate:.0%} acceptance and a step of {step / self.costs.one:.2f} target steps "
                f"({measured}), drafting would run at {best.expected_rate / none:.2f}x the target alone"
            )
            return None
        saving = expected_remaining * (1.0 / none - 1.0 / best.expected_rate)
        tokens = offer.catch_up()
        cost = self.costs.catch_up_cost(model.costs, tokens) + model.costs.load_s
        if cost >= saving:
            loading = "loading it and " if model.costs.load_s else ""
            model.declined = (
                f"not used: {loading}catching up on {tokens} tokens would cost {cost:.2f} s, more than the "
                f"{saving:.2f} s it could save over the rest of the answer"
            )
            return None
        model.declined = None
        return best

    def _staked(self, plan: Plan, alone: Plan) -> Plan:
        """A copy ``plan`` as it is if it beats the target ``alone`` with every acceptance estimate
        ``CAUTION_SIGMAS`` standard deviations lower; else cut to one token, or ``alone`` where one token
        does not beat it either."""
        estimates, none = self._copies[plan.source], alone.expected_rate
        cautious = estimates.rates(plan.offer.match_len, plan.k, sigmas=-CAUTION_SIGMAS)
        if plan.k == 1 or expected_tokens(cautious)[-1] / self._seconds(cautious, 0.0)[-1] > none:
            return plan
        one = self.best_plan(plan.source, estimates.rates(plan.offer.match_len, 1), 0.0, plan.offer)
        return one if one.expected_rate > none else alone

    def _probe(self, offers: Sequence[Offer]) -> Plan | None:
        """A copy drafter worth trying although its estimate loses: its hopeful rate would pay, and what
        the probes lost so far in this answer plus this one's loss should it fail stays within the budget."""
        none = self.target_alone_rate()
        base = 1.0 / none  # seconds per token of the target alone
        budget = EXPLORE_SHARE * self._answer_tokens * base - self._answer_loss
        if budget <= self._probe_floor:
            return None  # nothing to price until the budget grows (most rounds where nothing pays)
        best, cheapest = None, float("inf")
        for offer in offers:
            estimates = self._copies.get(offer.source)
            if estimates is None:
                continue
            k_max = min(offer.available, self.lookup_max, PROBE_MAX)
            hopeful = expected_tokens(estimates.rates(offer.match_len, k_max, sigmas=HOPEFUL_SIGMAS))
            seconds = self._seconds(estimates.rates(offer.match_len, k_max), 0.0)
            for k in range(1, k_max + 1):
                rate = hopeful[k] / seconds[k - 1]
                if rate <= none:
                    continue
                loss = seconds[k - 1] - base  # should every draft be rejected: the budget is never overrun
                cheapest = min(cheapest, loss)
                if loss <= budget and (best is None or rate > best.expected_rate):
                    best = Plan(offer.source, k, hopeful[k], rate, offer, explored=True)
        if best is None:
            self._probe_floor = min(cheapest, budget * 2) if cheapest < float("inf") else 0.0
            return None
        self._probe_pending = True
        self._explored += 1
        return best

    def plan(
        self, offers: Iterable[Offer], *, generated: int = 0, remaining: int | None = None, last_rows: int = 1
    ) -> Plan:
        """Choose this round's plan from the drafters' ``offers`` (taken lazily: a forced offer ends them).

        Args:
            generated, remaining: tokens of the answer so far and left in its budget (None: unbounded).
            last_rows: tokens of the target's latest pass (drafting after one-token passes pays the return).
        """
        method = self.method
        self._planned += 1
        self._leaving = self.costs.return_s if last_rows == 1 else 0.0
        if method == TARGET_ALONE:
            return _target_only(Idle.METHOD_NONE)
        if self.speculation_off is not None:
            return _target_only(Idle.NO_ROLLBACK)
        offered: dict[str, Offer] = {}
        self._copy_offers = []
        for offer in offers:
            if offer.available <= 0 or not self.allows(offer.source):
                continue
            if self._kinds[offer.source] == FORCED:  # certain tokens, drafted for free
                return Plan(offer.source, offer.available, offer.available + 1.0, 0.0, offer)
            offered.setdefault(offer.source, offer)
        self._copy_offers = [offer for source, offer in offered.items() if source in self._copies]
        if method != AUTO and len(offered) > 1:
            # A method several drafters name drafts from the first that offers, in the registry's order
            # (hybrid: the draft model only where lookup has nothing).
            first = next(iter(offered.values()))
            offered = {first.source: first}
        if self.draft_len is not None and method != AUTO:
            if not offered:
                return _target_only(Idle.NOTHING_OFFERED)
            offer = next(iter(offered.values()))
            return Plan(offer.source, min(offer.available, self.draft_len), 0.0, 0.0, offer)
        if self.costs.one_token_samples() < TRUSTED_SAMPLES:
            # Every choice is priced against a one-token pass, so measure a few first (one alone may have
            # been slowed by another process, or by the first pass after a prefill).
            return _target_only(Idle.MEASURING)
        if not offered:
            return _target_only(Idle.NOTHING_OFFERED)

        options = [_target_only(Idle.PRICED_OUT, self.target_alone_rate())] if method == AUTO else []
        models = []
        for source, offer in offered.items():
            if source in self._copies:
                k_max = min(offer.available, self.lookup_max)
                options.append(self.best_plan(source, self._copies[source].rates(offer.match_len, k_max), 0.0, offer))
            elif method != AUTO:
                model = self._models[source]
                rates = [model.acceptance.rate] * min(self.draft_max, offer.available)
                options.append(self.best_plan(source, rates, self.costs.step_cost(model.costs), offer))
            elif self._models[source].off is None:
                models.append(offer)
        best = max(options, key=lambda plan: plan.expected_rate)
        if method == AUTO and best.source in self._copies:
            best = self._staked(best, options[0])  # options[0]: the target alone
        for offer in models:
            expected = max(generated, MIN_EXPECTED_REMAINING)
            if remaining is not None:
                expected = min(expected, remaining)
            best = self._model_option(offer, best, expected) or best
        if best.source == TARGET_ALONE:
            best = self._probe(list(offered.values())) or best
        return best

    def remember(self, relative: Mapping[int, float]) -> None:
        """Seed pass costs measured in earlier sessions on this machine (see ``Costs.remember``)."""
        self.costs.remember(relative)
