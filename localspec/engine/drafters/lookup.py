"""The prompt-lookup drafter: copies what followed the longest earlier match in the session, for free
(the index, ``PromptLookupIndex``, is lookup_index.py's)."""

from __future__ import annotations

from collections.abc import Sequence

from localspec.engine.drafters.base import COPY, BaseDrafter, Draft, Offer, RoundState
from localspec.engine.drafters.lookup_index import PromptLookupIndex
from localspec.engine.tokens import common_prefix_length

# The lookup drafter's matching suffixes run up to 8 tokens: that tells a copy in progress (long matches)
# from chance (short ones).
LOOKUP_MAX_NGRAM = 8
# Prior acceptance per drafted token, keyed by match length (4 stands for 4-7): a match of 8 tokens or more
# is a copy in progress, the likelier to go on the longer it has run. Chosen by replay on the shipped
# workloads' greedy answers (scripts/replay/lookup.py).
PRIOR_LOOKUP_ACCEPTANCE = {1: 0.2, 2: 0.35, 3: 0.5, 4: 0.65, 8: 0.85, 16: 0.95, 32: 0.98, 64: 0.99}


class LookupDrafter(BaseDrafter):
    """Prompt lookup as a drafter: offers what the longest earlier match continues with, for free."""

    source = "lookup"
    kind = COPY
    prior = PRIOR_LOOKUP_ACCEPTANCE
    methods = ("lookup", "hybrid")  # hybrid: the draft model only where lookup offers nothing
    style = "green"

    def __init__(self) -> None:
        self.proposer = PromptLookupIndex(max_ngram=LOOKUP_MAX_NGRAM)

    @classmethod
    def make(cls, inputs) -> LookupDrafter:
        return cls()

    def begin(self, prompt: Sequence[int]) -> None:
        """Make the history equal ``prompt``, keeping the index of the common prefix."""
        seen = self.proposer.history
        keep = common_prefix_length(seen, prompt)
        if keep < len(seen):
            self.proposer.truncate(keep)
        self.proposer.extend(prompt[keep:])

    def offer(self, state: RoundState) -> Offer | None:
        tokens = self.proposer.propose(state.limit)
        return Offer(self.source, len(tokens), self.proposer.last_match_len, tokens) if tokens else None

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        return Draft(list(offer.tokens[:k]), None, self.source)

    def extend(self, tokens: Sequence[int]) -> None:
        self.proposer.extend(tokens)
