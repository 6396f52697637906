"""A thinking model's reasoning, told apart from its answer as it streams.

Templates of thinking models (Qwen3, DeepSeek-R1 and their kind) have the model write its reasoning
between ``<think>`` and ``</think>`` before the answer; some open the tag in the prompt themselves. Like
llama-server, the server hands the reasoning back apart from the answer, the way each API carries it
(chat ``reasoning_content``, Anthropic ``thinking`` blocks, Responses ``reasoning`` items).
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.tool_calls import partial_suffix

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


def has_reasoning(template: str) -> bool:
    """Whether a chat template has its model think between ``<think>`` tags."""
    return THINK_OPEN in template and THINK_CLOSE in template


class ReasoningSplitter:
    """Splits streamed answer text into ``ReasoningDelta`` pieces and the answer's own text (plain ``str``).

    Args:
        opened: the prompt ends inside ``<think>`` (the template opened it), so the answer starts as reasoning.
    """

    def __init__(self, *, opened: bool) -> None:
        # "start" (a <think> may open the answer), "think" (inside it), "after" (just closed) or "text"
        self._mode = "think" if opened else "start"
        self._held = ""

    def feed(self, text: str) -> list[ReasoningDelta | str]:
        self._held += text
        out: list[ReasoningDelta | str] = []
        while self._held:
            if self._mode == "start":
                stripped = self._held.lstrip()
                if stripped.startswith(THINK_OPEN):
                    self._held, self._mode = stripped[len(THINK_OPEN):], "think"
                elif THINK_OPEN.startswith(stripped):
                    break  # blanks or part of the tag so far
                else:
                    self._mode = "text"
            elif self._mode == "think":
                end = self._held.find(THINK_CLOSE)
                if end < 0:
                    keep = partial_suffix(self._held, THINK_CLOSE)
                    if len(self._held) > keep:
                        out.append(ReasoningDelta(self._held[: len(self._held) - keep]))
                        self._held = self._held[len(self._held) - keep:]
                    break
                if end:
                    out.append(ReasoningDelta(self._held[:end]))
                self._held, self._mode = self._held[end + len(THINK_CLOSE):], "after"
            elif self._mode == "after":
                # The blank lines between the reasoning and the answer belong to neither.
                self._held = self._held.lstrip()
                if self._held:
                    self._mode = "text"
            else:
                out.append(self._held)
                self._held = ""
        return out

    def finish(self) -> list[ReasoningDelta | str]:
        """Whatever was held back, at the end of the answer."""
        held, self._held = self._held, ""
        if not held or self._mode == "after":
            return []
        return [ReasoningDelta(held)] if self._mode == "think" else [held]

