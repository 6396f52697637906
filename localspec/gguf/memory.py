"""What a GGUF's architecture keeps in memory, read from its header alone (for ``check`` and ``doctor``).

A loaded model asks llama.cpp itself (``engine.llama.memory.MemoryPlan``); this table answers before any load,
from a header fetched over HTTP too. It copies the pinned llama.cpp's lists (src/llama-arch.cpp:
``llm_arch_is_recurrent``, ``llm_arch_is_hybrid``, ``llm_arch_supports_rs_rollback``), and
``tests/test_memory.py`` checks it against llama.cpp on generated models.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum


class MemoryKind(str, Enum):
    """What a model keeps in memory, and so how positions are taken back out of it."""

    KV = "kv"  # attention only: llama.cpp cuts any trailing positions out of the KV cache
    HYBRID = "hybrid"  # attention beside a recurrent state (Qwen3.5/3.6, LFM2, Nemotron-H, Granite 4)
    RECURRENT = "recurrent"  # a recurrent state only (Mamba, RWKV)

    __str__ = str.__str__
    __format__ = str.__format__


RECURRENT_ARCHITECTURES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHITECTURES = frozenset({
    "jamba", "falcon-h1", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
    "qwen3next", "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next", "qwen35", "qwen35moe", "qwen4exp",
    "deepseek4", "minimax-01",
})
# Those whose recurrent state keeps per-token snapshots (n_rs_seq), so rejected drafts roll back in place.
SNAPSHOT_ARCHITECTURES = frozenset({
    "kimi-k3", "qwen35", "qwen35moe", "qwen4exp", "deepseek4", "glm5-next", "nemotron_h", "nemotron_h_moe",
    "lfm2", "lfm2moe", "bailingmoe3",
})


def architecture(header: Mapping[str, object]) -> str:
    value = header.get("general.architecture")
    return value if isinstance(value, str) else "unknown"


def memory_kind(arch: str) -> MemoryKind:
    if arch in RECURRENT_ARCHITECTURES:
        return MemoryKind.RECURRENT
    return MemoryKind.HYBRID if arch in HYBRID_ARCHITECTURES else MemoryKind.KV


def speculation_note(arch: str) -> str:
    """One line: the memory this architecture keeps and what speculation does with it."""
    kind = memory_kind(arch)
    if kind == MemoryKind.KV:
        return f"{arch}: KV cache only; rejected drafts are cut out in place"
    if arch in SNAPSHOT_ARCHITECTURES:
        # Snapshots are off unless asked for: every pass would pay to write them.
        return (
            f"{arch}: {kind} (recurrent state); every verification saves a checkpoint and replays the accepted "
            "tokens after a rejection, or rolls back through per-token snapshots where they are switched on (--snapshots)"
        )
    return (
        f"{arch}: {kind} (recurrent state, no snapshots in llama.cpp); every verification saves a checkpoint "
        "and replays the accepted tokens after a rejection, so speculation pays only at high acceptance"
    )
