"""What every API's answer reports, computed once: ids, whether the answer was cut short, the token
counts (prompt, reused from the cache, evaluated, generated) and llama-server's ``timings``."""

from __future__ import annotations

import time
import uuid

from localspec.engine.decoding.stats import GenerationStats, StopReason
from localspec.server.reasoning import ReasoningDelta
from localspec.tool_calls import ToolCall, collect_calls

# The answer was cut short by the token budget or by the context window.
_CUT_SHORT = (StopReason.LENGTH, StopReason.CONTEXT_FULL)


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def truncated(stats: GenerationStats) -> bool:
    """Whether the answer stopped because the token budget or the context ran out."""
    return stats.stop_reason in _CUT_SHORT


def cached_tokens(stats: GenerationStats) -> int:
    """Prompt tokens reused from the cache rather than evaluated."""
    return stats.prompt_tokens - stats.prefill_tokens


def timings(stats: GenerationStats, method: str) -> dict:
    """The figures llama-server reports under ``timings``, plus the speculation method, from the engine's stats."""
    figures = stats.to_dict()
    return {
        "cache_n": cached_tokens(stats),
        "prompt_n": stats.prefill_tokens,
        "prompt_ms": stats.prefill_s * 1000.0,
        "prompt_per_token_ms": _per_token_ms(stats.prefill_tok_per_s),
        "prompt_per_second": stats.prefill_tok_per_s,
        "predicted_n": stats.generated_tokens,
        "predicted_ms": stats.decode_s * 1000.0,
        "predicted_per_token_ms": _per_token_ms(stats.decode_tok_per_s),
        "predicted_per_second": stats.decode_tok_per_s,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
        "method": method,
        "by_source": figures["by_source"],
    }


def _per_token_ms(per_second: float) -> float:
    return 1000.0 / per_second if per_second > 0 else 0.0  # 0 where nothing was timed, as llama-server says


def collect(events: list) -> tuple[str, str, list[ToolCall]]:
    """The reasoning, the text and the whole tool calls of an answer's events."""
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    text, calls = collect_calls([e for e in events if not isinstance(e, ReasoningDelta)])
    return reasoning, text, calls
