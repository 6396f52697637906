"""The drafter interface: every draft source answers the same two questions.

``offer``: what it could draft now (how many tokens, on what evidence), or None. The planner
(controller.py) prices the offers and picks one, and a length. ``draft``: the tokens themselves (and q,
the distribution each was drawn from, where the drafter samples). Grammar-forced tokens, prompt lookup,
suffix decoding and a draft model all go through this; a new drafter is one module with a class like
these plus one line in ``drafters.py``::

    class EchoDrafter(BaseDrafter):
        source = Source.ECHO       # a new member of Source: how its tokens are named in every figure
        kind = COPY                 # how the planner prices it: COPY, MODEL or FORCED
        prior = {1: 0.2, 8: 0.8}    # acceptance per match length (COPY) or {1: a} (MODEL) until measured

        @classmethod
        def make(cls, inputs):      # None where it cannot run (inputs: target, draft model, history)
            return cls()

        def offer(self, state):     # cheap: called every round
            tokens = self.guess(state.context, state.limit)
            return Offer(self.source, len(tokens), match_len=..., tokens=tokens) if tokens else None

        def draft(self, offer, k, state):
            return Draft(offer.tokens[:k], None, self.source)

The hooks ``begin``, ``extend``, ``judged`` and ``end`` follow a generation (no-ops in ``BaseDrafter``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from localspec.engine.decoding.sampling import SamplingParams

if TYPE_CHECKING:
    from localspec.engine.decoding.constraints import GrammarConstraint


class Source(str, Enum):
    """Where a token came from: the target itself or one of the drafters (the names figures use)."""

    TARGET = "target"
    GRAMMAR = "grammar"  # forced by the grammar
    LOOKUP = "lookup"  # copied from the session (prompt lookup)
    SUFFIX = "suffix"  # copied from earlier answers (suffix decoding)
    DRAFT = "draft"  # a draft model
    MTP = "mtp"  # the target's own multi-token-prediction head
    EAGLE3 = "eagle3"  # an EAGLE-3 head beside the target
    DFLASH = "dflash"  # a DFlash head beside the target (a block per pass)

    __str__ = str.__str__
    __format__ = str.__format__


# Step.method of a round that drafted nothing: the target alone.
TARGET_ALONE = "none"

# How the planner prices a drafter's offer (see controller.py).
FORCED = "forced"  # certain tokens (a grammar's), drafted for free and always taken
COPY = "copy"  # free to draft; acceptance per match length, per draft position
MODEL = "model"  # drafting costs a pass per token (or one per block) and a catch-up; one acceptance estimate


@dataclass(frozen=True)
class RoundState:
    """What a drafter may look at in one round."""

    context: Sequence[int]  # every token so far, the last one not yet in the target's cache
    limit: int  # the most tokens the planner could take
    sampling: SamplingParams
    rng: np.random.Generator
    constraint: GrammarConstraint | None = None


@dataclass(frozen=True)
class Offer:
    """What a drafter could draft now; the planner prices it by ``source`` and the evidence."""

    source: Source
    available: int  # tokens it can draft now
    match_len: int = 0  # COPY: the length of the match the tokens continue
    tokens: Sequence[int] = ()  # COPY and FORCED: the tokens, already known
    # MODEL: tokens it would evaluate before drafting (the whole context before its first use), computed
    # only when the planner considers it
    catch_up: Callable[[], int] = lambda: 0
    sources: Sequence[int] = ()  # SUFFIX: the stored positions the tokens come from


@dataclass
class Draft:
    tokens: list[int]
    # q[i] is the draft distribution at position i, or None for a deterministic drafter (point mass).
    q: list[np.ndarray] | None
    source: Source | str
    # A model drafter's measured costs: context tokens it evaluated as a batch before its steps, and its
    # passes of one or two tokens, each giving the next draft token's logits (a block drafter: the rows of
    # its one pass).
    catch_up_tokens: int = 0
    catch_up_s: float = 0.0
    steps: int = 0
    steps_s: float = 0.0


NO_DRAFT = Draft([], None, TARGET_ALONE)


class BaseDrafter:
    """No-op hooks; a drafter overrides ``offer`` and ``draft`` and whichever hooks it needs."""

    source: ClassVar[Source]
    kind: ClassVar[str]
    prior: ClassVar[dict[int, float]]
    # MODEL: a draft step's cost relative to a target step until measured, where the drafter knows better
    # than the decoder's guess for a draft model (None: that guess).
    cost_ratio: float | None = None
    # MODEL: one pass drafts the whole block (DFlash), priced like a target pass of as many rows, not a
    # step per token.
    block: ClassVar[bool] = False

    @classmethod
    def make(cls, inputs) -> BaseDrafter | None:
        """This drafter for a decoder built from ``inputs`` (drafters.DrafterInputs), or None if it cannot
        run there (no draft model, no answer history, ...)."""
        raise NotImplementedError

    def begin(self, prompt: Sequence[int]) -> None:
        """A generation starts continuing ``prompt`` (the full context)."""

    def offer(self, state: RoundState) -> Offer | None:
        raise NotImplementedError

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        raise NotImplementedError

    def extend(self, tokens: Sequence[int]) -> None:
        """``tokens`` joined the context (a round's emitted tokens)."""

    def judged(self, offer: Offer, draft: Draft, accepted: int) -> None:
        """The target accepted the first ``accepted`` tokens of this drafter's ``draft``."""

    def end(self, context: Sequence[int]) -> None:
        """The generation ended with ``context`` agreed (the caches must not hold more of it)."""
