"""Grammar-forced tokens as a drafter: what the grammar allows only one way is drafted for free."""

from __future__ import annotations

from localspec.engine.drafters.base import FORCED, BaseDrafter, Draft, Offer, RoundState


class GrammarDrafter(BaseDrafter):
    """Offers the tokens the running generation's grammar forces (a key, a closing brace, a name).

    The target still verifies them, so a forced token its own tokenization would not choose costs one
    rejected draft position, never a different answer.
    """

    source = "grammar"
    kind = FORCED
    style = "yellow"
    prior = {1: 1.0}

    @classmethod
    def make(cls, inputs) -> GrammarDrafter:
        return cls()

    def offer(self, state: RoundState) -> Offer | None:
        forced = state.constraint.forced() if state.constraint is not None else []
        return Offer(self.source, len(forced), tokens=forced) if forced else None

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        return Draft(list(offer.tokens[:k]), None, self.source)
