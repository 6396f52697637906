"""The draft-model drafter: a small model of the same tokenizer, with its own KV cache, drafts token by
token; when sampling it keeps q, the distribution each draft token was actually drawn from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.drafters.base import MODEL, BaseDrafter, Draft, Offer, RoundState
from localspec.engine.drafters.model_drafting import DEFAULT_MIN_CONFIDENCE, draw_draft, split_catch_up
from localspec.engine.llama.model import Model

if TYPE_CHECKING:
    from localspec.engine.decoding.constraints import GrammarConstraint

# Why a method that drafts with a draft model cannot run on a pair without one: the fix.
NO_DRAFT_MODEL = "pass --draft PATH or use --profile"
# Prior acceptance of a draft token until measured.
PRIOR_DRAFT_ACCEPTANCE = 0.6


class DraftModelDrafter(BaseDrafter):
    """A small model of the same tokenizer that drafts up to k tokens per round.

    Its KV cache keeps the common prefix with the context across rounds, so a round usually evaluates
    one or two catch-up tokens (a longer catch-up is a batch of its own, see ``split_catch_up``). Drafting
    stops early when the draft's own top probability falls below ``min_confidence``: a token it is unsure
    of is rarely accepted and still costs a target row.
    The model is loaded on first use, so ``--method auto`` never pays for a draft it does not pick.
    """

    source = "draft"
    kind = MODEL
    prior = {1: PRIOR_DRAFT_ACCEPTANCE}
    methods = ("draft", "hybrid")
    style = "cyan"
    needs = "a draft model"

    def __init__(self, load: Callable[[], Model], *, min_confidence: float = DEFAULT_MIN_CONFIDENCE) -> None:
        self._load = load
        self._model: Model | None = None
        self.min_confidence = min_confidence

    @property
    def model(self) -> Model:
        if self._model is None:
            self._model = self._load()
        return self._model

    @property
    def loaded(self) -> bool:
        return self._model is not None

    def another(self) -> DraftModelDrafter:
        """A proposer on the same weights (loaded on its first use) with a KV cache of its own."""
        return DraftModelDrafter(lambda: self.model.another_context(), min_confidence=self.min_confidence)

    @classmethod
    def missing(cls, inputs) -> str:
        return "" if inputs.draft is not None else NO_DRAFT_MODEL

    @classmethod
    def make(cls, inputs) -> DraftModelDrafter:
        return inputs.draft

    def offer(self, state: RoundState) -> Offer:
        context = state.context
        return Offer(self.source, state.limit, catch_up=lambda: self.catch_up(context))

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        return self.propose(state.context, k, state.sampling, state.rng, constraint=state.constraint)

    def end(self, context: Sequence[int]) -> None:
        self.sync(context)

    def catch_up(self, context: Sequence[int]) -> int:
        """How many context tokens the next ``propose`` evaluates as a batch before its steps (nearly the
        whole context before the first use)."""
        return split_catch_up(self._model.common_prefix(context) if self._model else 0, len(context))[1]

    def propose(
        self,
        context: Sequence[int],
        max_tokens: int,
        sampling: SamplingParams,
        rng: np.random.Generator,
        constraint: GrammarConstraint | None = None,
    ) -> Draft:
        """Up to ``max_tokens`` draft tokens. Under a ``constraint`` each is drawn from the draft's masked
        distribution (q is that one), so no draft token is one the grammar refuses."""
        model = self.model
        started = perf_counter()
        keep, batch = split_catch_up(model.common_prefix(context), len(context))
        model.rollback(keep)  # a recurrent draft restores its checkpoint and replays, counted in its steps
        max_tokens = min(max_tokens, model.n_ctx - len(context))
        catch_up_started = perf_counter()
        if batch:
            model.eval(context[keep : keep + batch], n_logits=0, prefill=True)  # the draft need not be exact
        catch_up_s = perf_counter() - catch_up_started
        logits = model.eval(context[keep + batch :], n_logits=1)[0]
        if max_tokens > 1:
            model.checkpoint()  # its steps are one-token passes, whose drafts no snapshot can take back
        tokens, q, steps = draw_draft(
            logits, max_tokens, lambda token: model.eval([token], n_logits=1)[0], sampling=sampling, rng=rng,
            constraint=constraint, min_confidence=self.min_confidence, is_end=model.is_end_of_generation,
        )
        return Draft(tokens, q, self.source, batch, catch_up_s, steps + 1, perf_counter() - started - catch_up_s)

    def sync(self, context: Sequence[int]) -> None:
        """Drop whatever the draft's KV cache holds beyond the agreed context (e.g. after an interrupt)."""
        if self._model is not None:
            self._model.rollback(self._model.common_prefix(context))

    def close(self) -> None:
        if self._model is not None:
            self._model.close()
            self._model = None

