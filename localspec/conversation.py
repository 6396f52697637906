"""A conversation over a decoder: the model's own chat template, KV reuse across turns, context overflow.

Each turn renders the whole conversation with the GGUF's chat template (sandboxed) and hands the full
token sequence to the decoder, which evaluates only what its KV cache does not already hold. When the
conversation outgrows the context window, the oldest turns are dropped (the system prompt is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.decoding.text import TextPiece
from localspec.errors import PromptTooLong, UsageError
from localspec.gguf.templates import has_thinking_switch, render_chat, shows_late_system

TEMPLATE_KEY = "tokenizer.chat_template"


class Conversation:
    """Multi-turn chat (or, with ``chat=False``, raw continuation of the text given)."""

    def __init__(self, decoder: SpeculativeDecoder, *, system: str | None = None, chat: bool = True) -> None:
        self.decoder = decoder
        self.model = decoder.target
        self.chat = chat
        self.template = self.model.metadata.get(TEMPLATE_KEY) if chat else None
        if chat and not self.template:
            raise UsageError(f"{self.model.path.name} has no chat template; use --raw to continue plain text")
        self.system = system
        self.messages: list[dict] = []
        self.dropped_turns = 0

    def reset(self) -> None:
        self.messages.clear()

    def render_text(
        self, messages: list[dict] | None = None, *, tools: list[dict] | None = None, thinking: bool | None = None,
    ) -> tuple[str, bool]:
        """The prompt text of ``messages`` (default: the conversation so far) and whether a BOS goes before it.

        ``tools``: OpenAI function tools, handed to the template's own ``tools`` variable. ``thinking``:
        the template's thinking switch, where it has one (None: the template's default).
        """
        messages = self.messages if messages is None else messages
        if not self.chat:
            return "".join(m["content"] for m in messages), self.model.add_bos
        bos = self.model.token_bytes(self.model.bos_id).decode("utf-8", "replace") if self.model.bos_id >= 0 else ""
        eos = self.model.token_bytes(self.model.eos_id).decode("utf-8", "replace") if self.model.eos_id >= 0 else ""
        system = [{"role": "system", "content": self.system}] if self.system else []
        switches = {"enable_thinking": thinking} if thinking is not None and has_thinking_switch(self.template) else {}
        text = render_chat(self.template, fit_system_messages(self.template, system + messages),
                           add_generation_prompt=True, tools=tools or None, bos_token=bos, eos_token=eos, **switches)
        # Templates that write the BOS text themselves must not get a second one from the tokenizer.
        return text, self.model.add_bos and not (bos and text.startswith(bos))

    def render(self, messages: list[dict], *, tools: list[dict] | None = None) -> list[int]:
        """Prompt tokens for ``messages`` (after the system prompt, if any), ending with the assistant's turn."""
        return self.tokenize(*self.render_text(messages, tools=tools))

    def tokenize(self, text: str, add_bos: bool) -> list[int]:
        """Tokens of a rendered prompt (its chat markers as the special tokens they stand for)."""
        return self.model.tokenize(text, add_bos=add_bos, special=True)

    def prompt_tokens(self, reserve: int) -> list[int]:
        """Tokens of the conversation so far, dropping the oldest turns until ``reserve`` tokens fit after it."""
        n_ctx = self.model.n_ctx
        tokens = self.render(self.messages)
        while len(tokens) + reserve > n_ctx and len(self.messages) > 1:
            # Drop the oldest user turn and its answer; the system prompt is not in self.messages.
            cut = 2 if len(self.messages) > 2 and self.messages[1]["role"] == "assistant" else 1
            del self.messages[:cut]
            self.dropped_turns += 1
            tokens = self.render(self.messages)
        return tokens

    def ask(
        self,
        text: str,
        *,
        max_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        stop: Sequence[str] = (),
        on_dropped: Callable[[int], None] | None = None,
        prefill_progress: Callable[[int, int], None] | None = None,
    ) -> Iterator[TextPiece]:
        """Stream the answer to ``text``; the answer (even a partial one) joins the conversation."""
        before, dropped_before = list(self.messages), self.dropped_turns
        self.messages.append({"role": "user", "content": text})
        try:
            # Keep room for a useful answer, but never drop history just to fit a huge --max-tokens.
            prompt = self.prompt_tokens(reserve=min(max_tokens, self.model.n_ctx // 4))
            pieces = self.decoder.stream(prompt, stop=stop, max_tokens=max_tokens, sampling=sampling,
                                         prefill_progress=prefill_progress)
        except PromptTooLong:
            # A turn that can never fit is refused as a whole: no unanswered turn, no history dropped for it.
            self.messages[:], self.dropped_turns = before, dropped_before
            raise
        if self.dropped_turns > dropped_before and on_dropped is not None:
            on_dropped(self.dropped_turns - dropped_before)
        answer: list[str] = []
        try:
            for piece in pieces:
                answer.append(piece.text)
                yield piece
        finally:
            self.messages.append({"role": "assistant", "content": "".join(answer)})


def fit_system_messages(template: str, messages: list[dict]) -> list[dict]:
    """``messages`` with their system messages where the model reads them best and ``template`` shows them.

    Agents send system messages between turns (Claude Code's environment after the user's request, Codex's
    developer notes). One that follows user or tool turns goes before them, so the model answers those
    turns rather than continue a system message, and a conversation's prompt only grows at its end. A
    template that shows only a leading system message gets the leading ones joined into one, and each
    later one put before the next user turn (or as a user turn of its own when none follows).
    """
    ordered: list[dict] = []
    for message in messages:
        at = len(ordered)
        while message["role"] == "system" and at and ordered[at - 1]["role"] in ("user", "tool"):
            at -= 1
        ordered.insert(at, message)
    if not any(m["role"] == "system" for m in ordered[1:]) or shows_late_system(template):
        return ordered
    out: list[dict] = []
    waiting: list[str] = []  # late system texts for the next user turn
    for message in ordered:
        if message["role"] == "system" and all(m["role"] == "system" for m in out):
            out = [{"role": "system", "content": "\n\n".join([*(m["content"] for m in out), message["content"]])}]
        elif message["role"] == "system":
            waiting.append(message["content"])
        elif message["role"] == "user" and waiting:
            out.append({**message, "content": "\n\n".join([*waiting, message["content"]])})
            waiting = []
        else:
            out.append(message)
    if waiting:
        out.append({"role": "user", "content": "\n\n".join(waiting)})
    return out
