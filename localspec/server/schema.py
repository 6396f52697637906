"""OpenAI request bodies in, checked field by field; response bodies and errors out.

The checks are written out rather than left to a schema library so that every rejection is one
message naming the field and what to send instead, in OpenAI's error shape. Fields that would change
the answer but that localspec cannot honour (``n`` > 1, tools, penalties, logprobs...) are refused,
never silently ignored; fields that do not change the answer (``user``, ``model``...) are accepted.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from localspec.engine.stats import GenerationStats

ROLES = ("system", "user", "assistant")
# Newer OpenAI clients send "developer" where older ones sent "system".
ROLE_ALIASES = {"developer": "system"}
MAX_STOP_STRINGS = 16


class APIError(Exception):
    """An error answered as ``{"error": {"message", "type", "code"}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "code": self.code}}


def invalid(message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, code=code)


@dataclass(frozen=True)
class GenerationRequest:
    """What one request asks for; ``None`` sampling fields take the server's defaults."""

    messages: list[dict] | None = None  # chat: [{"role", "content"}] with string content
    prompt: str | None = None  # raw completion
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False

    def sampling_overrides(self) -> dict:
        fields = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                  "min_p": self.min_p, "seed": self.seed}
        return {name: value for name, value in fields.items() if value is not None}


# -- parsing ---------------------------------------------------------------------------------------
def parse_chat_request(body: object) -> GenerationRequest:
    body = _object(body)
    _refuse_unsupported(body, chat=True)
    if "messages" not in body:
        raise invalid("'messages' is required: send a list of {\"role\", \"content\"} objects", "missing_messages")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list of {\"role\", \"content\"} objects", "missing_messages")
    return GenerationRequest(messages=[_message(m, i) for i, m in enumerate(messages)], **_common(body))


def parse_completion_request(body: object) -> GenerationRequest:
    body = _object(body)
    _refuse_unsupported(body, chat=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # the openai client sends a one-element list for a single prompt
    if not isinstance(prompt, str) or not prompt:
        raise invalid("'prompt' must be a non-empty string (one prompt per request; token ids are not accepted)")
    return GenerationRequest(prompt=prompt, **_common(body))


def _object(body: object) -> dict:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", "invalid_json")
    return body


def _refuse_unsupported(body: dict, *, chat: bool) -> None:
    n = _integer(body, "n", minimum=1)
    if n is not None and n > 1:
        raise invalid("'n' > 1 is not supported: localspec generates one choice per request; send n=1")
    if body.get("tools") or body.get("functions"):
        raise invalid("'tools' and 'functions' are not supported by localspec serve; send the request without them",
                      "unsupported_parameter")
    if body.get("tool_choice") not in (None, "none"):
        raise invalid("'tool_choice' is not supported: localspec serve has no tool calling", "unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        if _number(body, name, -2.0, 2.0):
            raise invalid(f"'{name}' is not supported: leave it out or send 0", "unsupported_parameter")
    if body.get("logit_bias"):
        raise invalid("'logit_bias' is not supported: leave it out", "unsupported_parameter")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise invalid("'logprobs' are not supported: leave them out", "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise invalid("'response_format' other than {\"type\": \"text\"} is not supported", "unsupported_parameter")
    if not chat:
        if body.get("echo") or body.get("suffix"):
            raise invalid("'echo' and 'suffix' are not supported: leave them out", "unsupported_parameter")
        best_of = _integer(body, "best_of", minimum=1)
        if best_of is not None and best_of > 1:
            raise invalid("'best_of' > 1 is not supported: send best_of=1", "unsupported_parameter")


def _message(message: object, index: int) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(f"{where} must be an object with 'role' and 'content'")
    role = message.get("role")
    role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
    if role not in ROLES:
        raise invalid(f"{where}.role is {message.get('role')!r}; use one of {', '.join(ROLES)}", "invalid_role")
    return {"role": role, "content": _content(message.get("content"), where)}


def _content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"{where}.content: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(f"{where}.content must be a string or a list of text parts")


def _common(body: dict) -> dict:
    max_tokens = _integer(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", minimum=1)
    stream = _boolean(body, "stream") or False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object such as {\"include_usage\": true}")
    include_usage = _boolean(options or {}, "include_usage", "stream_options.include_usage") or False
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("'model' must be a string")
    return dict(
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_number(body, "top_p", 0.0, 1.0),
        top_k=_integer(body, "top_k", minimum=0),
        min_p=_number(body, "min_p", 0.0, 1.0),
        seed=_integer(body, "seed", minimum=0),
        stop=_stop(body.get("stop")),
        stream=stream,
        include_usage=stream and include_usage,
    )


def _stop(stop: object) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise invalid(f"'stop' must be a non-empty string or a list of up to {MAX_STOP_STRINGS} non-empty strings")
    return tuple(stop)


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    # bool is an int in Python, but true is not a temperature.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise invalid(f"'{name}' must be a number from {low:g} to {high:g}")
    return float(value)


def _integer(body: dict, name: str, *, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        raise invalid(f"'{name}' must be an integer" + (f" of at least {minimum}" if minimum is not None else ""))
    return value


def _boolean(body: dict, name: str, label: str | None = None) -> bool | None:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid(f"'{label or name}' must be true or false")
    return value


# -- responses -------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def finish_reason(stats: GenerationStats) -> str:
    """OpenAI's reason: ``length`` when the token budget or the context ran out, else ``stop``."""
    return "length" if stats.stop_reason in ("length", "context_full") else "stop"


def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.prompt_tokens - stats.prefill_tokens},
    }


def timings(stats: GenerationStats, method: str) -> dict:
    """The figures llama-server reports under ``timings``, plus the speculation method, from the engine's stats."""
    figures = stats.to_dict()
    return {
        "cache_n": stats.prompt_tokens - stats.prefill_tokens,
        "prompt_n": stats.prefill_tokens,
        "prompt_ms": stats.prefill_s * 1000.0,
        "prompt_per_second": stats.prefill_tok_per_s,
        "predicted_n": stats.generated_tokens,
        "predicted_ms": stats.decode_s * 1000.0,
        "predicted_per_second": stats.decode_tok_per_s,
        "draft_n": stats.drafted,
        "draft_n_accepted": stats.accepted,
        "method": method,
        "by_method": figures["by_method"],
    }


class ChatFormat:
    """Bodies of /v1/chat/completions: ``chat.completion`` and ``chat.completion.chunk`` objects."""

    def __init__(self, model: str) -> None:
        self.model, self.id, self.created = model, new_id("chatcmpl"), now()

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def response(self, text: str, stats: GenerationStats, method: str) -> dict:
        return {
            **self._head("chat.completion"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason(stats)}],
            "usage": usage(stats),
            "timings": timings(stats, method),
        }

    def chunk(self, text: str | None, *, opening: bool = False, with_usage: bool = False) -> dict:
        delta = {"role": "assistant", "content": ""} if opening else {"content": text}
        body = {**self._head("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        return {**body, "usage": None} if with_usage else body

    def closing_chunks(self, stats: GenerationStats, method: str, *, with_usage: bool) -> list[dict]:
        last = {**self._head("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason(stats)}],
                "timings": timings(stats, method)}
        if not with_usage:
            return [last]
        # OpenAI's usage chunk comes after the finish reason, with no choices; the figures ride on it too.
        figures = {**self._head("chat.completion.chunk"), "choices": [], "usage": usage(stats),
                   "timings": last["timings"]}
        return [{**last, "usage": None}, figures]


class CompletionFormat:
    """Bodies of /v1/completions: ``text_completion`` objects, streamed or whole."""

    def __init__(self, model: str) -> None:
        self.model, self.id, self.created = model, new_id("cmpl"), now()

    def _body(self, text: str, reason: str | None) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}

    def response(self, text: str, stats: GenerationStats, method: str) -> dict:
        return {**self._body(text, finish_reason(stats)), "usage": usage(stats), "timings": timings(stats, method)}

    def chunk(self, text: str | None, *, opening: bool = False, with_usage: bool = False) -> dict:
        body = self._body(text or "", None)
        return {**body, "usage": None} if with_usage else body

    def closing_chunks(self, stats: GenerationStats, method: str, *, with_usage: bool) -> list[dict]:
        last = {**self._body("", finish_reason(stats)), "timings": timings(stats, method)}
        if not with_usage:
            return [last]
        figures = {**self._body("", None), "choices": [], "usage": usage(stats), "timings": last["timings"]}
        return [{**last, "usage": None}, figures]


ResponseFormat = ChatFormat | CompletionFormat
