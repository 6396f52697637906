"""How a drafter that is a model (a draft model, a head) picks its tokens from its logits; and the round of
a head that chains on its own state (``ChainedHeadDrafter``: MTP, EAGLE-3).

Greedy: the argmax. Sampled: a token drawn from q, the distribution verification then judges it by.
Drafting stops once the drafter's top probability falls below ``min_confidence`` (a token it is unsure of
is rarely accepted and still costs a target row). Under a grammar each token comes from the masked
distribution (q is that one), so no draft token is one the grammar refuses; the grammar's look-ahead is
taken back afterwards, since verification decides what is emitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from localspec.engine.decoding.sampling import SamplingParams, probabilities, sample
from localspec.engine.drafters.base import MODEL, BaseDrafter, Draft, Offer, RoundState
from localspec.engine.planner.costs import companion_head_cost_ratio
from localspec.gguf.heads import COMPANION_ARCHITECTURES

if TYPE_CHECKING:
    from localspec.engine.decoding.constraints import GrammarConstraint

DEFAULT_MIN_CONFIDENCE = 0.5
# No confidence cut for a head (MTP, EAGLE-3, DFlash): a round the head declined would go unmeasured (no
# acceptance recorded) while its step was paid, so the planner would go on paying for steps that draft
# nothing; it picks the draft length from the measured acceptance instead.
HEAD_MIN_CONFIDENCE = 0.0
# A round usually starts by evaluating the one or two tokens accepted since the last; a longer catch-up
# (after a gap, or the whole context on first use) is evaluated as a batch first, so it is timed apart
# from the steps.
STEADY_CATCH_UP = 2


def split_catch_up(common: int, length: int) -> tuple[int, int]:
    """(cache entries kept, tokens to evaluate as a batch before the first step) for a context of
    ``length`` tokens whose first ``common`` the drafter's cache holds. At least the last context token is
    evaluated again, by the first step: its logits give the first draft token."""
    keep = min(common, length - 1)
    behind = length - keep
    return keep, (behind - 1 if behind > STEADY_CATCH_UP else 0)


def draw_draft(
    logits: np.ndarray,
    max_tokens: int,
    step: Callable[[int], np.ndarray],
    *,
    sampling: SamplingParams,
    rng: np.random.Generator,
    constraint: GrammarConstraint | None,
    min_confidence: float,
    is_end: Callable[[int], bool],
) -> tuple[list[int], list[np.ndarray] | None, int]:
    """(tokens, q per token or None when greedy, steps taken) for up to ``max_tokens`` draft tokens.

    ``logits``: the drafter's guess of the first token; ``step(token)``: its guess of the one after
    ``token`` (one drafter step each).
    """
    if constraint is not None and len(logits) != constraint.n_vocab:
        constraint = None  # a drafter with a padded vocabulary of another size drafts unconstrained
    tokens: list[int] = []
    qs: list[np.ndarray] = []
    steps = 0
    followed = 0  # draft tokens the constraint followed, taken back after drafting
    for i in range(max_tokens):
        if constraint is not None:
            constraint.restrict(logits[None, :])
        if sampling.greedy:
            token = int(np.argmax(logits))
            confidence = 1.0 / float(np.exp(logits - logits[token]).sum())
        else:
            q = probabilities(logits, sampling)
            confidence = float(q.max())
        if confidence < min_confidence:
            break
        if not sampling.greedy:
            token = sample(q, rng)
            qs.append(q)
        tokens.append(token)
        if constraint is not None:
            if is_end(token):
                break  # the grammar allowed the end: nothing follows it
            constraint.advance([token])
            followed += 1
        if i + 1 < max_tokens:
            logits = step(token)
            steps += 1
    if constraint is not None:
        constraint.step_back(followed)
    return tokens, None if sampling.greedy else qs, steps


class CompanionHeadDrafter(BaseDrafter):
    """A drafter whose head is a companion file given as the pair's draft (EAGLE-3, DFlash): it drafts
    where that file is a head of its kind, and is built from the target and the file."""

    kind = MODEL
    drafts_with_head = True

    @classmethod
    def missing(cls, inputs) -> str:
        head = inputs.head
        if head is not None and head.kind == cls.source:
            return ""
        return f"the pair's draft is not {COMPANION_ARCHITECTURES[cls.source]} head"

    @classmethod
    def make(cls, inputs) -> CompanionHeadDrafter:
        return cls(inputs.target, inputs.head)


def companion_cost_ratio(head_params: int, target) -> float:
    """The prior for a pass of a companion head of ``head_params`` parameters against a pass of ``target``
    (the rule: ``costs.companion_head_cost_ratio``)."""
    return companion_head_cost_ratio(
        head_params, n_vocab=target.n_vocab, n_embd=target.n_embd_out, n_params=target.n_params
    )


class ChainedHeadDrafter(BaseDrafter):
    """The round of a head that drafts token by token on a context of its own (MTP, EAGLE-3).

    Entry i of the head's cache is built from ``entries(context)[i]`` and a state row (``states``: the
    target's, which subclasses say how to read). The head catches up lazily, when it drafts: the entries
    since its last draft are evaluated in one batch whose last row gives the first draft token; further
    draft tokens chain the head on its own state, and those entries are taken back after drafting, as they
    were built on guesses. Rollbacks of the target need nothing here: entries are judged against the context
    by their tokens, and the target's rows below its position belong to the tokens it holds. Subclasses set
    ``target`` and ``head`` (a ``llama.heads`` head context).
    """

    kind = MODEL
    drafts_with_head = True
    min_confidence = HEAD_MIN_CONFIDENCE

    # Tokens at the start of the context that build no entry (EAGLE-3: the first, which has no token before
    # it to take the target's layer inputs from).
    unentered = 0

    def entries(self, context: Sequence[int]) -> Sequence[int]:
        """The token each entry of the head's cache is built from, for ``context``."""
        return context[self.unentered :] if self.unentered else context

    def states(self, start: int, stop: int) -> np.ndarray:
        """The state rows the head reads with entries start..stop - 1."""
        raise NotImplementedError

    def offer(self, state: RoundState) -> Offer | None:
        context = state.context
        if len(context) <= self.unentered:  # asked every round: no copy of a context of 20k tokens
            return None
        return Offer(self.source, state.limit, catch_up=lambda: self._catch_up(context)[1])

    def _catch_up(self, context: Sequence[int]) -> tuple[int, int]:
        entries = self.entries(context)
        return split_catch_up(self.head.common_prefix(entries), len(entries))

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        context, head = state.context, self.head
        entries = self.entries(context)
        n = len(entries)
        started = perf_counter()
        keep, batch = self._catch_up(context)
        head.rollback(keep)
        rows = self.states(keep, n)
        if batch:
            head.eval(entries[keep : keep + batch], rows[:batch], logits=False)
        catch_up_s = perf_counter() - started
        logits, state_row = head.eval(entries[keep + batch :], rows[batch:])
        chained = [state_row]

        def step(token: int) -> np.ndarray:
            logits, state_row = head.eval([token], chained[-1][None, :])
            chained.append(state_row)
            return logits

        try:
            tokens, q, steps = draw_draft(
                logits, min(k, self.target.n_ctx - len(context)), step, sampling=state.sampling, rng=state.rng,
                constraint=state.constraint, min_confidence=self.min_confidence,
                is_end=self.target.is_end_of_generation,
            )
        finally:
            head.rollback(n)
        return Draft(tokens, q, self.source, batch, catch_up_s, steps + 1, perf_counter() - started - catch_up_s)

    def end(self, context: Sequence[int]) -> None:
        self.head.rollback(self.head.common_prefix(self.entries(context)))

    def close(self) -> None:
        self.head.close()
