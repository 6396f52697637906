"""The DFlash drafter: a companion head drafts a whole block of tokens in one pass.

A DFlash head keeps, per context position, keys and values made from the target's layer inputs there
(the target keeps them per position: ``Model.features``), injected lazily when it drafts. A draft is
one pass of the head over [the last context token, mask x k]: the block's rows attend to every entry and
to each other, and each mask row's logits give one draft token (``DFlashHead``). The block is taken back
at once, so the head never holds a guess. Rollbacks of the target need nothing here: entries are judged
against the context by their tokens, and feature rows below the target's position belong to the tokens it
holds. Positions are drawn independently, each from its own row (q is that row's distribution), which
verification judges like any other draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

from localspec.engine.drafters.base import Draft, Offer, RoundState
from localspec.engine.drafters.model_drafting import (
    HEAD_MIN_CONFIDENCE,
    CompanionHeadDrafter,
    companion_cost_ratio,
    draw_draft,
)
from localspec.engine.llama.heads import DFlashHead
from localspec.engine.llama.model import Model
from localspec.gguf.heads import HeadFile

# Prior acceptance of a draft token until measured, as for an EAGLE-3 head: a block's first positions are
# its surest, and one estimate stands for them all.
PRIOR_DFLASH_ACCEPTANCE = 0.6


class DFlashDrafter(CompanionHeadDrafter):
    """Drafts with a DFlash head given as the pair's draft file (``gguf/heads.py`` checks it fits)."""

    source = "dflash"
    block = True
    prior = {1: PRIOR_DFLASH_ACCEPTANCE}
    methods = ("dflash",)
    style = "bright_cyan"
    needs = "a DFlash head as the draft"

    def __init__(self, target: Model, head: HeadFile) -> None:
        target.capture_layer_inputs(head.layers)
        self.target = target
        self.head = DFlashHead(head.path, target, len(head.layers) * target.n_embd,
                               mask_token=head.mask_token, causal=head.causal)
        self.max_block = head.block_size - 1  # the drafts a trained block holds after the last token
        self.cost_ratio = companion_cost_ratio(self.head.n_params, target)  # a one-row pass's

    def offer(self, state: RoundState) -> Offer | None:
        context = state.context
        if len(context) < 2:
            return None  # the block attends to the target's layer inputs of at least one token
        available = min(state.limit, self.max_block, self.target.n_ctx - len(context))
        return Offer(self.source, available, catch_up=lambda: len(context) - 1 - self._kept(context))

    def _kept(self, context: Sequence[int]) -> int:
        return self.head.common_prefix(context[:-1])

    def draft(self, offer: Offer, k: int, state: RoundState) -> Draft:
        context, head = state.context, self.head
        n = len(context) - 1  # positions whose layer inputs the target has: all but the last token
        started = perf_counter()
        keep = self._kept(context)
        head.rollback(keep)
        head.inject(context[keep:n], self.target.features[keep:n])
        catch_up_s = perf_counter() - started
        rows = head.block(context[-1], k)
        position = iter(rows[1:])
        tokens, q, _ = draw_draft(
            rows[0], k, lambda token: next(position), sampling=state.sampling, rng=state.rng,
            constraint=state.constraint, min_confidence=HEAD_MIN_CONFIDENCE, is_end=self.target.is_end_of_generation,
        )
        # One pass of k + 1 rows: the controller prices it against the target's pass of as many.
        return Draft(tokens, q, self.source, n - keep, catch_up_s, k + 1, perf_counter() - started - catch_up_s)

    def end(self, context: Sequence[int]) -> None:
        self.head.rollback(self._kept(context))

    def close(self) -> None:
        self.head.close()
