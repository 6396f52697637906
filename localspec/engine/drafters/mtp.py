"""The MTP drafter: the target's own multi-token-prediction head (Qwen3.5/3.6's "nextn") drafts.

The head reads the token at position p and the target's last hidden state at p - 1 and guesses the token
at p + 2; its KV cache (``MtpHead``) holds one entry per context position, and the target keeps its hidden
states per position (``Model.hidden``). The round (lazy catch-up, chained steps on the head's own
hidden state, entries taken back) is every chained head's (``ChainedHeadDrafter``).
"""

from __future__ import annotations

import numpy as np

from localspec.engine.drafters.model_drafting import HEAD_MIN_CONFIDENCE, ChainedHeadDrafter
from localspec.engine.llama.heads import MtpHead
from localspec.engine.llama.model import Model
from localspec.engine.planner.costs import mtp_head_cost_ratio

# Prior acceptance of a head's draft token until measured (reported first-token rates for Qwen3.5/3.6 and
# DeepSeek-V3 heads run 0.7-0.9; chained steps fare worse).
PRIOR_MTP_ACCEPTANCE = 0.7


class MtpDrafter(ChainedHeadDrafter):
    """Drafts with the target's MTP head; needs a target loaded with ``load_mtp`` and one head."""

    source = "mtp"
    prior = {1: PRIOR_MTP_ACCEPTANCE}
    methods = ("mtp",)
    style = "blue"
    needs = "the target's own MTP head"

    def __init__(self, target: Model, *, min_confidence: float = HEAD_MIN_CONFIDENCE) -> None:
        target.capture_hidden()
        self.target = target
        self.head = MtpHead(target)
        self.min_confidence = min_confidence
        self.cost_ratio = head_cost_ratio(target)

    @classmethod
    def missing(cls, inputs) -> str:
        return unsupported_heads(inputs.target.mtp_layers) or ""

    @classmethod
    def make(cls, inputs) -> MtpDrafter:
        return cls(inputs.target)

    def states(self, start: int, stop: int) -> np.ndarray:
        """The target's hidden states before positions start..stop - 1 (none before the first token)."""
        rows = self.target.hidden[max(start - 1, 0) : stop - 1]
        return rows if start > 0 else np.vstack([np.zeros((1, self.head.n_embd), np.float32), rows])


def unsupported_heads(layers: int) -> str | None:
    """Why this build's MTP drafting cannot use a model with ``layers`` heads, or None if it can."""
    if layers == 0:
        return "the model has no MTP head (or it was loaded without it)"
    if layers > 1:
        # Step-3.5's chained heads each need the prefix evaluated again under their own layer offset.
        return f"{layers} chained MTP heads: localspec drafts with single-head models (Qwen3.5/3.6, GLM, DeepSeek)"
    return None


def head_cost_ratio(target: Model) -> float:
    """The prior for a step of ``target``'s MTP head against a target step, from its shapes (the rule:
    ``costs.mtp_head_cost_ratio``)."""
    return mtp_head_cost_ratio(
        n_vocab=target.n_vocab, n_embd=target.n_embd_out, n_params=target.n_params, n_layers=target.n_layers
    )
