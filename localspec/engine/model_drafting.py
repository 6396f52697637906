"""How a drafter that is a model (a draft model, the target's MTP head) picks its tokens from its logits.

Greedy: the argmax. Sampled: a token drawn from q, the distribution verification then judges it by.
Drafting stops once the drafter's top probability falls below ``min_confidence`` (a token it is unsure of
is rarely accepted and still costs a target row). Under a grammar each token comes from the masked
distribution (q is that one), so no draft token is one the grammar refuses; the grammar's look-ahead is
taken back afterwards, since verification decides what is emitted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from localspec.engine.sampling import SamplingParams, probabilities, sample

if TYPE_CHECKING:
    from localspec.engine.constraints import GrammarConstraint

DEFAULT_MIN_CONFIDENCE = 0.5
# No confidence cut for a head (MTP, EAGLE-3, DFlash): a round the head declined would go unmeasured (no
# acceptance recorded) while its step was paid, so the planner would go on paying for steps that draft
# nothing; it picks the draft length from the measured acceptance instead.
HEAD_MIN_CONFIDENCE = 0.0
# A round usually starts by evaluating the one or two tokens accepted since the last; a longer catch-up
# (after a gap, or the whole context on first use) is evaluated as a batch first, so it is timed apart
# from the steps.
STEADY_CATCH_UP = 2


def split_catch_up(common: int, length: int) -> tuple[int, int]:
    """(cache entries kept, tokens to evaluate as a batch before the first step) for a context of
    ``length`` tokens whose first ``common`` the drafter's cache holds. At least the last context token is
    evaluated again, by the first step: its logits give the first draft token."""
    keep = min(common, length - 1)
    behind = length - keep
    return keep, (behind - 1 if behind > STEADY_CATCH_UP else 0)


def draw_draft(
    logits: np.ndarray,
    max_tokens: int,
    step: Callable[[int], np.ndarray],
    *,
    sampling: SamplingParams,
    rng: np.random.Generator,
    constraint: GrammarConstraint | None,
    min_confidence: float,
    is_end: Callable[[int], bool],
) -> tuple[list[int], list[np.ndarray] | None, int]:
    """(tokens, q per token or None when greedy, steps taken) for up to ``max_tokens`` draft tokens.

    ``logits``: the drafter's guess of the first token; ``step(token)``: its guess of the one after
    ``token`` (one drafter step each).
    """
    if constraint is not None and len(logits) != constraint.n_vocab:
        constraint = None  # a drafter with a padded vocabulary of another size drafts unconstrained
    tokens: list[int] = []
    qs: list[np.ndarray] = []
    steps = 0
    followed = 0  # draft tokens the constraint followed, taken back after drafting
    for i in range(max_tokens):
        if constraint is not None:
            constraint.restrict(logits[None, :])
        if sampling.greedy:
            token = int(np.argmax(logits))
            confidence = 1.0 / float(np.exp(logits - logits[token]).sum())
        else:
            q = probabilities(logits, sampling)
            confidence = float(q.max())
        if confidence < min_confidence:
            break
        if not sampling.greedy:
            token = sample(q, rng)
            qs.append(q)
        tokens.append(token)
        if constraint is not None:
            if is_end(token):
                break  # the grammar allowed the end: nothing follows it
            constraint.advance([token])
            followed += 1
        if i + 1 < max_tokens:
            logits = step(token)
            steps += 1
    if constraint is not None:
        constraint.step_back(followed)
    return tokens, None if sampling.greedy else qs, steps
