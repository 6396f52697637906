"""A conversation over a decoder: the model's own chat template, KV reuse across turns, context overflow.

Each turn renders the whole conversation with the GGUF's chat template (sandboxed) and hands the full
token sequence to the decoder, which evaluates only what its KV cache does not already hold. When the
conversation outgrows the context window, the oldest turns are dropped (the system prompt is kept).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from localspec.engine.decoder import SpeculativeDecoder
from localspec.engine.sampling import SamplingParams
from localspec.engine.text import TextPiece
from localspec.errors import PromptTooLong, UsageError
from localspec.gguf.templates import render_chat

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
        self, messages: list[dict] | None = None, *, tools: list[dict] | None = None
    ) -> tuple[str, bool]:
        """The prompt text of ``messages`` (default: the conversation so far) and whether a BOS goes before it.

        ``tools``: OpenAI function tools, handed to the template's own ``tools`` variable.
        """
        messages = self.messages if messages is None else messages
        if not self.chat:
            return "".join(m["content"] for m in messages), self.model.add_bos
        bos = self.model.token_bytes(self.model.bos_id).decode("utf-8", "replace") if self.model.bos_id >= 0 else ""
        eos = self.model.token_bytes(self.model.eos_id).decode("utf-8", "replace") if self.model.eos_id >= 0 else ""
        system = [{"role": "system", "content": self.system}] if self.system else []
        text = render_chat(self.template, system + messages, add_generation_prompt=True, tools=tools or None,
                           bos_token=bos, eos_token=eos)
        # Templates that write the BOS text themselves must not get a second one from the tokenizer.
        return text, self.model.add_bos and not (bos and text.startswith(bos))

    def render(self, messages: list[dict], *, tools: list[dict] | None = None) -> list[int]:
        """Prompt tokens for ``messages`` (after the system prompt, if any), ending with the assistant's turn."""
        text, add_bos = self.render_text(messages, tools=tools)
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
