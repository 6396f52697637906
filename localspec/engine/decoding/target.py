"""What the decoder core and the drafters use of the model they verify with: the ``Target`` interface.

The llama.cpp ``Model`` (engine/llama/model.py) is the target of every real run; the replays of
scripts/replay/ put a stand-in of recorded answers behind the same interface (tests/test_scripts.py checks
that both provide every member). The head drafters (MTP, EAGLE-3, DFlash) go further than this interface:
their head contexts share the llama.cpp ``Model``'s own context, and they read the per-position states it
keeps for them (``capture_hidden``/``hidden``, ``capture_layer_inputs``/``features``), so they take a
``Model``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from localspec.engine.llama.memory import MemoryPlan


@runtime_checkable
class Target(Protocol):
    """The model a ``SpeculativeDecoder`` verifies drafts with, whose output it reproduces exactly."""

    # The decoder reads a large prompt pass's (tokens, seconds) here as a hint of long drafts' cost, then clears it.
    large_eval: tuple[int, float] | None

    @property
    def n_ctx(self) -> int:
        """The context window, in tokens."""

    @property
    def n_past(self) -> int:
        """Tokens the memory holds now."""

    @property
    def n_vocab(self) -> int:
        """Columns of a row of logits."""

    @property
    def n_embd_out(self) -> int:
        """Width of the output projection's input (with ``n_vocab`` and ``n_params``, prices its share)."""

    @property
    def n_params(self) -> int:
        """Parameters of the model."""

    @property
    def kernels(self) -> str:
        """The kernel mode its passes run (EXACT or FAST, engine/llama/kernels.py)."""

    @property
    def memory_plan(self) -> MemoryPlan:
        """What its memory is and how it rolls back."""

    @property
    def mtp_layers(self) -> int:
        """MTP heads loaded with it (0: none to draft with)."""

    @property
    def last_rows(self) -> int:
        """Tokens of its latest pass (0 before any): the one-token passes after a larger one run slower for a
        while (``Costs.return_s``)."""

    @property
    def keeps_head_inputs(self) -> bool:
        """Whether its passes also keep what a head reads (``hidden`` or ``features``), which the target
        alone does not pay for."""

    @property
    def replayed_tokens(self) -> int:
        """Tokens evaluated again so far because a rollback could not keep them."""

    def token_bytes(self, token: int) -> bytes:
        """The bytes ``token`` stands for."""

    def is_end_of_generation(self, token: int) -> bool:
        """Whether ``token`` ends an answer."""

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` the memory already holds."""

    def eval(
        self,
        tokens: Sequence[int],
        *,
        n_logits: int = 1,
        progress: Callable[[int, int], None] | None = None,
        prefill: bool = False,
    ) -> np.ndarray:
        """Append ``tokens``; the (n_logits, n_vocab) logits of the last ``n_logits`` of them."""

    def can_remove(self, n: int) -> bool:
        """Whether the next pass's last ``n`` positions roll back in place (no checkpoint needed)."""

    def checkpoint(self) -> float:
        """Save the memory to roll back to; the seconds it took."""

    def rollback(self, n_past: int) -> float:
        """Make the memory hold exactly its first ``n_past`` tokens; the seconds it took."""

    def another_context(self) -> Target:
        """The same weights on an empty memory of their own."""

    def close(self) -> None:
        """Free its context (the decoder that made it with ``another_context`` closes it)."""
