"""Token sequences as every cache compares them (the target's, a head's, the prompt cache's)."""

from __future__ import annotations

from collections.abc import Sequence


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences (what a cache can keep)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
