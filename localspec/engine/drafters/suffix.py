"""The suffix drafter: copies the continuation earlier answers best support (the index is suffix_index.py's,
the answers on disk persist/history.py's)."""

from __future__ import annotations

from localspec.engine.drafters.base import COPY, BaseDrafter, Draft, Offer, RoundState
from localspec.engine.persist.history import HistoryStore

# Suffix decoding copies earlier answers, priced like lookup by the length of the match its occurrences
# share with the context, but from a store that holds other requests' answers: a short match there is
# likelier chance than in the current conversation, so its priors start lower.
PRIOR_SUFFIX_ACCEPTANCE = {1: 0.1, 4: 0.4, 8: 0.7, 16: 0.85, 32: 0.95}


class SuffixDrafter(BaseDrafter):
    """Suffix decoding as a drafter: offers the continuation earlier answers best support, and tells the
    history how each draft fared (the decoder hands it each answer, whatever the method)."""

    source = "suffix"
    kind = COPY
    prior = PRIOR_SUFFIX_ACCEPTANCE
    style = "magenta"

    def __init__(self, history: HistoryStore) -> None:
        self.history = history

    @classmethod
    def make(cls, inputs) -> SuffixDrafter | None:
        return None if inputs.history is None else cls(inputs.history)

    def offer(self, state: RoundState) -> Offer | None:
        draft = self.history.index.propose(state.context, state.limit)
        if not draft.tokens:
            return None
        return Offer(self.source, len(draft.tokens), draft.match_len, draft.tokens, sources=draft.sources)

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        return Draft(list(offer.tokens[:k]), None, self.source)

    def judged(self, offer: Offer, draft: Draft, accepted: int) -> None:
        self.history.record(offer.sources[: len(draft.tokens)], accepted)
