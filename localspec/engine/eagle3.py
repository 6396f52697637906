"""The EAGLE-3 drafter: a companion head file beside the target drafts from the target's own layer inputs.

An EAGLE-3 head reads, at every position, the inputs of three target layers side by side (the target keeps
them per position: ``LlamaModel.features``), encodes them into one row g, and builds its KV entry for the
next token from that token and g (``Eagle3Head``). Like the MTP head it catches up lazily, when it drafts:
the entries since its last draft are evaluated in one batch whose last row gives the first draft token,
further draft tokens chain the head on its own state, and those entries are taken back after drafting.
Rollbacks of the target need nothing here: the head's entries are judged against the context by their
tokens, and feature rows below the target's position always belong to the tokens it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from time import perf_counter

from localspec.engine.backend import Eagle3Head, LlamaModel
from localspec.engine.drafting import MODEL, BaseDrafter, Draft, Offer, RoundState, Source
from localspec.engine.model_drafting import HEAD_MIN_CONFIDENCE, draw_draft, split_catch_up

# Prior acceptance of a head's draft token until measured (EAGLE-3 reports 0.6-0.8 for its first token on
# chat and code; chained steps fare worse).
PRIOR_EAGLE3_ACCEPTANCE = 0.6


class Eagle3Drafter(BaseDrafter):
    """Drafts with an EAGLE-3 head given as the pair's draft file (``gguf/heads.py`` checks it fits)."""

    source = Source.EAGLE3
    kind = MODEL
    prior = {1: PRIOR_EAGLE3_ACCEPTANCE}

    def __init__(self, target: LlamaModel, path: Path, layers: Sequence[int]) -> None:
        target.capture_layer_inputs(layers)
        self.target = target
        self.head = Eagle3Head(path, target, features=len(layers) * target.n_embd)
        # A step's cost against a target pass, by parameters until measured: the head's block, and an output
        # projection counted at the target's size (a head lends it, or carries a smaller one of its own).
        output = target.n_vocab * target.n_embd_out
        self.cost_ratio = min(1.0, (self.head.n_params + output) / max(target.n_params, 1))

    @classmethod
    def make(cls, inputs) -> Eagle3Drafter | None:
        from localspec.engine.controller import method_uses  # the controller prices the drafters

        if inputs.head is None or inputs.head.kind != cls.source or not method_uses(inputs.method, cls.source):
            return None
        return cls(inputs.target, inputs.head.path, inputs.head.layers)

    def offer(self, state: RoundState) -> Offer | None:
        context = state.context
        if len(context) < 2:
            return None  # the first entry needs the target's layer inputs at a token before it
        return Offer(self.source, state.limit, catch_up=lambda: self._catch_up(context)[1])

    def _catch_up(self, context: Sequence[int]) -> tuple[int, int]:
        entries = context[1:]  # entry e is built from the token at e + 1
        return split_catch_up(self.head.common_prefix(entries), len(entries))

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        context, head = state.context, self.head
        entries = context[1:]
        n = len(entries)
        started = perf_counter()
        keep, batch = self._catch_up(context)
        head.rollback(keep)
        # g at every position whose entry is evaluated now: the target has passed all but the last token.
        g = head.encode(self.target.features[keep:n])
        if batch:
            head.eval(entries[keep : keep + batch], g[:batch], logits=False)
        catch_up_s = perf_counter() - started
        logits, state_row = head.eval(entries[keep + batch :], g[batch:])
        chained = [state_row]

        def step(token: int):
            logits, state_row = head.eval([token], chained[-1][None, :])
            chained.append(state_row)
            return logits

        try:
            tokens, q, steps = draw_draft(
                logits, min(k, self.target.n_ctx - len(context)), step, sampling=state.sampling, rng=state.rng,
                constraint=state.constraint, min_confidence=HEAD_MIN_CONFIDENCE, is_end=self.target.is_end_of_generation,
            )
        finally:
            head.rollback(n)  # entries past the context were built on the head's own guesses
        return Draft(tokens, q, self.source, batch, catch_up_s, steps + 1, perf_counter() - started - catch_up_s)

    def end(self, context: Sequence[int]) -> None:
        self.head.rollback(self.head.common_prefix(context[1:]))

    def close(self) -> None:
        self.head.close()
