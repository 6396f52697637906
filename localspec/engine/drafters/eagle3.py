"""The EAGLE-3 drafter: a companion head file beside the target drafts from the target's own layer inputs.

An EAGLE-3 head reads, at every position, the inputs of three target layers side by side (the target keeps
them per position: ``Model.features``), encodes them into one row g, and builds its KV entry for the
next token from that token and g (``Eagle3Head``): entry e is the token at e + 1 with g at e, as llama.cpp's
own loop lays them out. The round (lazy catch-up, chained steps, entries taken back) is every chained
head's (``ChainedHeadDrafter``).
"""

from __future__ import annotations

import numpy as np

from localspec.engine.drafters.model_drafting import ChainedHeadDrafter, CompanionHeadDrafter, companion_cost_ratio
from localspec.engine.llama.heads import Eagle3Head
from localspec.engine.llama.model import Model
from localspec.gguf.heads import HeadFile

# Prior acceptance of a head's draft token until measured (EAGLE-3 reports 0.6-0.8 for its first token on
# chat and code; chained steps fare worse).
PRIOR_EAGLE3_ACCEPTANCE = 0.6


class Eagle3Drafter(CompanionHeadDrafter, ChainedHeadDrafter):
    """Drafts with an EAGLE-3 head given as the pair's draft file (``gguf/heads.py`` checks it fits)."""

    source = "eagle3"
    prior = {1: PRIOR_EAGLE3_ACCEPTANCE}
    methods = ("eagle3",)
    style = "bright_blue"
    needs = "an EAGLE-3 head as the draft"

    def __init__(self, target: Model, head: HeadFile) -> None:
        target.capture_layer_inputs(head.layers)
        self.target = target
        self.head = Eagle3Head(head.path, target, features=len(head.layers) * target.n_embd)
        self.cost_ratio = companion_cost_ratio(self.head.n_params, target)

    unentered = 1  # the first entry needs the target's layer inputs at a token before it

    def states(self, start: int, stop: int) -> np.ndarray:
        # g at every position whose entry is evaluated now: the target has passed all but the last token.
        return self.head.encode(self.target.features[start:stop])
