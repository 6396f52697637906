"""The MTP drafter: the target's own multi-token-prediction head (Qwen3.5/3.6's "nextn" block) drafts.

The head reads the token at position p and the target's last hidden state at p - 1 and guesses the token
at p + 2; its KV cache (``MtpHead``) holds one entry per context position. The target keeps its hidden
states per position (``LlamaModel.hidden``), so the head catches up lazily, when it drafts: the entries
since its last draft are evaluated in one batch whose last row gives the first draft token. Further draft
tokens chain the head on its own hidden state (the target's is not known yet past the context), and those
entries are taken back after drafting: they were built on guesses. Rollbacks of the target need nothing
here: the head's entries are judged against the context by their tokens, and rows of ``hidden`` below
the target's position always belong to the tokens it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

import numpy as np

from localspec.engine.backend import LlamaModel, MtpHead
from localspec.engine.drafting import MODEL, BaseDrafter, Draft, Offer, RoundState, Source
from localspec.engine.model_drafting import HEAD_MIN_CONFIDENCE, draw_draft, split_catch_up

# Prior acceptance of a head's draft token until measured (reported first-token rates for Qwen3.5/3.6 and
# DeepSeek-V3 heads run 0.7-0.9; chained steps fare worse).
PRIOR_MTP_ACCEPTANCE = 0.7


class MtpDrafter(BaseDrafter):
    """Drafts with the target's MTP head; needs a target loaded with ``load_mtp`` and one head."""

    source = Source.MTP
    kind = MODEL
    prior = {1: PRIOR_MTP_ACCEPTANCE}

    def __init__(self, target: LlamaModel, *, min_confidence: float = HEAD_MIN_CONFIDENCE) -> None:
        target.capture_hidden()
        self.target = target
        self.head = MtpHead(target)
        self.min_confidence = min_confidence
        self.cost_ratio = head_cost_ratio(target)

    @classmethod
    def make(cls, inputs) -> MtpDrafter | None:
        from localspec.engine.controller import method_uses  # the controller prices the drafters

        # Keeping hidden states changes the target's prompt passes, so a method without the head goes without.
        if not method_uses(inputs.method, cls.source) or unsupported_heads(inputs.target.mtp_layers):
            return None
        return cls(inputs.target)

    def offer(self, state: RoundState) -> Offer:
        context = state.context
        return Offer(self.source, state.limit, catch_up=lambda: self._catch_up(context)[1])

    def _catch_up(self, context: Sequence[int]) -> tuple[int, int]:
        return split_catch_up(self.head.common_prefix(context), len(context))

    def _states(self, start: int, stop: int) -> np.ndarray:
        """The target's hidden states before positions start..stop - 1 (none before the first token)."""
        rows = self.target.hidden[max(start - 1, 0) : stop - 1]
        return rows if start > 0 else np.vstack([np.zeros((1, self.head.n_embd), np.float32), rows])

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        context, head = state.context, self.head
        n = len(context)
        started = perf_counter()
        keep, batch = self._catch_up(context)
        head.rollback(keep)
        if batch:
            head.eval(context[keep : keep + batch], self._states(keep, keep + batch), logits=False)
        catch_up_s = perf_counter() - started
        logits, hidden = head.eval(context[keep + batch :], self._states(keep + batch, n))
        chained = [hidden]

        def step(token: int) -> np.ndarray:
            logits, hidden = head.eval([token], chained[-1][None, :])
            chained.append(hidden)
            return logits

        try:
            tokens, q, steps = draw_draft(
                logits, min(k, self.target.n_ctx - n), step, sampling=state.sampling, rng=state.rng,
                constraint=state.constraint, min_confidence=self.min_confidence,
                is_end=self.target.is_end_of_generation,
            )
        finally:
            head.rollback(n)  # entries past the context were built on the head's own guesses
        return Draft(tokens, q, self.source, batch, catch_up_s, steps + 1, perf_counter() - started - catch_up_s)

    def end(self, context: Sequence[int]) -> None:
        self.head.rollback(self.head.common_prefix(context))

    def close(self) -> None:
        self.head.close()


def unsupported_heads(layers: int) -> str | None:
    """Why this build's MTP drafting cannot use a model with ``layers`` heads, or None if it can."""
    if layers == 0:
        return "the model has no MTP head (or it was loaded without it)"
    if layers > 1:
        # Step-3.5's chained heads each need the prefix evaluated again under their own layer offset.
        return f"{layers} chained MTP heads: localspec drafts with single-head models (Qwen3.5/3.6, GLM, DeepSeek)"
    return None


def head_cost_ratio(target: LlamaModel) -> float:
    """A head step's cost relative to a target step, from the shapes, until measured: one block of the
    trunk's and the output projection, which on a small model with a large vocabulary is most of a pass."""
    output = target.n_vocab * target.n_embd_out
    blocks = max(target.n_params - 2 * output, 0)  # embeddings and output projection aside (tied or not)
    layers = max(target.n_layers, 1)
    return (blocks / layers + output) / (blocks + output)
