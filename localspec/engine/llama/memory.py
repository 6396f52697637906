"""How a loaded model's memory rolls back: the plan the controller prices and people read.

The kinds of memory are ``gguf.memory.MemoryKind`` (one enum: ``check`` reads it from a header, a loaded
model asks llama.cpp); ``Model.rollback`` carries the plan out.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.gguf.memory import MemoryKind

# Recurrent-state snapshots kept per pass where the architecture supports them (llama.cpp's n_rs_seq), so a
# verification of up to that many drafts rolls back in place. Off by default: every pass then writes its
# snapshots, and at Qwen3.5 0.8B's shapes 8 of them slow even a one-token pass by ~8% (the target alone
# would run slower than stock llama.cpp's), while a checkpoint costs ~6% of a one-token pass per
# verification plus a replay after a rejection, and only when speculating (scripts/bench/rollback.py).
DEFAULT_ROLLBACK_SNAPSHOTS = 0

# How the rejected drafts of a verification leave a recurrent state.
SNAPSHOTS = "snapshots"  # per-token snapshots of the last pass (n_rs_seq): removed in place, for free
CHECKPOINT = "checkpoint"  # the state saved before the pass, restored, and the accepted tokens replayed


@dataclass(frozen=True)
class MemoryPlan:
    """How a loaded model's memory rolls back, for the controller's prices and for people to read."""

    memory: MemoryKind
    snapshots: int  # trailing positions of one pass removable in place (n_rs_seq); unlimited for KV
    checkpoint_bytes: int  # one saved recurrent state (0 for KV)
    refused: str | None = None  # why no rollback works at all: speculation is off for this model

    @property
    def rollback_window(self) -> int | None:
        """Rejected drafts one pass can drop in place: any for a KV cache (None), else its snapshots."""
        return None if self.memory == MemoryKind.KV else self.snapshots

    @property
    def method(self) -> str:
        """How a verification's rejected drafts are removed: KV, SNAPSHOTS (then CHECKPOINT past them), or
        CHECKPOINT."""
        if self.memory == MemoryKind.KV:
            return MemoryKind.KV.value
        return SNAPSHOTS if self.snapshots else CHECKPOINT

    def describe(self) -> str:
        if self.memory == MemoryKind.KV:
            return "kv: KV cache only, rejected drafts are cut out in place"
        if self.refused:
            return f"{self.memory}: no speculation ({self.refused})"
        state = f"{self.checkpoint_bytes / 2**20:.1f} MiB per recurrent state"
        if self.snapshots:
            return (
                f"{self.memory}: {self.snapshots} snapshots per pass ({self.snapshots * self.checkpoint_bytes / 2**20:.0f} MiB), "
                f"longer drafts checkpoint and replay; {state}"
            )
        return f"{self.memory}: checkpoint before each verification, replay the accepted tokens; {state}"
