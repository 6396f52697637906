"""The drafter interface: every draft source answers the same two questions, and says what it is.

``offer``: what it could draft now (how many tokens, on what evidence), or None. The planner
(planner/controller.py) prices the offers and picks one, and a length. ``draft``: the tokens themselves
(and q, the distribution each was drawn from, where the drafter samples). Grammar-forced tokens, prompt
lookup, suffix decoding, a draft model and the heads all go through this.

A drafter class also carries everything the rest of localspec knows about it: its name in figures
(``source``), how the planner prices it (``kind``, ``prior``), the ``--method`` names that draft with it
(``methods``), how the live view colours its tokens (``style``), and what it needs to run (``needs``,
``missing``). So a new drafter is one module with a class like this one plus one line in registry.py::

    class EchoDrafter(BaseDrafter):
        source = "echo"             # its name in every figure, the legend and --method
        kind = COPY                 # how the planner prices it: COPY, MODEL or FORCED
        prior = {1: 0.2, 8: 0.8}    # acceptance per match length (COPY) or {1: a} (MODEL) until measured
        methods = ("echo",)         # the --method names that draft with it (auto drafts with every drafter)
        style = "red"               # the live view's colour for its tokens

        @classmethod
        def make(cls, inputs):      # inputs: target, draft model, history, head (registry.DrafterInputs)
            return cls()

        def offer(self, state):     # cheap: called every round
            tokens = self.guess(state.context, state.limit)
            return Offer(self.source, len(tokens), match_len=..., tokens=tokens) if tokens else None

        def draft(self, offer, k, state):
            return Draft(offer.tokens[:k], None, self.source)

The hooks ``begin``, ``extend``, ``judged``, ``end`` and ``close`` follow a generation and the decoder
(no-ops in ``BaseDrafter``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from localspec.engine.decoding.sampling import SamplingParams

if TYPE_CHECKING:
    from localspec.engine.decoding.constraints import GrammarConstraint


# The source of a token the target chose itself (a drafter's tokens carry its ``source``).
TARGET = "target"
# The source of a round that drafted nothing, and the method that never drafts: the target alone.
TARGET_ALONE = "none"
# The most tokens a copy drafter offers in one round (a verification is the last token plus the drafts).
MAX_COPY_DRAFT = 64

# How the planner prices a drafter's offer (see controller.py).
FORCED = "forced"  # certain tokens (a grammar's), drafted for free and always taken
COPY = "copy"  # free to draft; acceptance per match length, per draft position
MODEL = "model"  # drafting costs a pass per token (or one per block) and a catch-up; one acceptance estimate


@dataclass(slots=True)
class RoundState:
    """What a drafter may look at in one round."""

    context: Sequence[int]  # every token so far, the last one not yet in the target's cache
    limit: int  # the most tokens the planner could take
    sampling: SamplingParams
    rng: np.random.Generator
    constraint: GrammarConstraint | None = None


@dataclass(slots=True)
class Offer:
    """What a drafter could draft now; the planner prices it by ``source`` and the evidence."""

    source: str
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
    source: str
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

    source: ClassVar[str]
    kind: ClassVar[str]
    prior: ClassVar[dict[int, float]]
    # The --method names that draft with it besides ``auto`` (a FORCED drafter drafts in every method but
    # none); a method several drafters name drafts from the first of them, in the registry's order, that
    # offers something.
    methods: ClassVar[tuple[str, ...]] = ()
    style: ClassVar[str] = ""  # the live view's colour for its tokens (a Rich style)
    needs: ClassVar[str] = ""  # what it drafts with, where that may be missing ("a draft model")
    drafts_with_head: ClassVar[bool] = False  # a head: the model's own, or a companion file
    # MODEL: a draft step's cost relative to a target step until measured, where the drafter knows better
    # than the decoder's guess for a draft model (None: that guess).
    cost_ratio: float | None = None
    # MODEL: one pass drafts the whole block (DFlash), priced like a target pass of as many rows, not a
    # step per token.
    block: ClassVar[bool] = False

    @classmethod
    def missing(cls, inputs) -> str:
        """Why it cannot draft for a decoder built from ``inputs`` (registry.DrafterInputs), in words that
        follow ``needs``; "" when it can."""
        return ""

    @classmethod
    def make(cls, inputs) -> BaseDrafter | None:
        """This drafter for a decoder built from ``inputs``, which it can draft for (``missing`` says so)
        and whose method drafts with it; None where it has nothing to do (no answer history)."""
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

    def close(self) -> None:
        """The decoder is closed: free what the drafter holds beside the target (a head's context)."""
