"""OpenAI request bodies in, checked field by field; response bodies and errors out.

The checks are written out rather than left to a schema library so that every rejection is one
message naming the field and what to send instead, in OpenAI's error shape. Fields that would change
the answer but that localspec cannot honour (``n`` > 1, penalties, logprobs...) are refused, never
silently ignored; fields that do not change the answer (``user``, ``model``...) are accepted.

Every API (this one, anthropic.py, responses.py) translates its body into the one ``GenerationRequest``:
messages in the shape Hugging Face chat templates read (assistant ``tool_calls`` with arguments as an
object, ``role: "tool"`` results), tools as OpenAI function tools. The rules shared by the APIs (a tool's
shape, tool results answering earlier calls, tool_choice against tools) are written here once.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import dataclass, field

from localspec.engine.stats import GenerationStats
from localspec.tool_calls import CallDelta, ToolCall, collect_calls

ROLES = ("system", "user", "assistant", "tool")
# Newer OpenAI clients send "developer" where older ones sent "system".
ROLE_ALIASES = {"developer": "system"}
MAX_STOP_STRINGS = 16
# OpenAI's rule for function names; templates and parsers rely on names without quotes or spaces.
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
TOOL_CHOICES = ("auto", "none", "required")


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

    def anthropic_body(self) -> dict:
        """Anthropic's error shape, for /v1/messages."""
        kind = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}
        return {"type": "error", "error": {"type": kind.get(self.status, "api_error"), "message": self.message}}


def invalid(message: str, code: str = "invalid_value") -> APIError:
    return APIError(400, message, code=code)


@dataclass(frozen=True)
class GenerationRequest:
    """What one request asks for; ``None`` sampling fields take the server's defaults."""

    messages: list[dict] | None = None  # chat, in the chat-template shape (see the module docstring)
    prompt: str | None = None  # raw completion
    api: str = "chat.completions"  # which API asked, for the log line
    tools: list[dict] = field(default_factory=list)  # [{"type": "function", "function": {name, ...}}]
    tool_choice: str = "auto"  # "auto", "none", "required" or "function" (then tool_name)
    tool_name: str | None = None
    # Off unless asked for, as in llama-server: small models given the choice tend to repeat calls.
    parallel_tool_calls: bool = False
    json_schema: dict | None = None  # the answer must be JSON valid against it
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False

    @property
    def offered_tools(self) -> list[dict]:
        """The tools the model is shown: none with tool_choice 'none', which keeps calls out of the answer."""
        return self.tools if self.tool_choice != "none" else []

    def sampling_overrides(self) -> dict:
        fields = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                  "min_p": self.min_p, "seed": self.seed}
        return {name: value for name, value in fields.items() if value is not None}


# -- parsing ---------------------------------------------------------------------------------------
def parse_chat_request(body: object) -> GenerationRequest:
    body = object_body(body)
    _refuse_unsupported(body, chat=True)
    if "messages" not in body:
        raise invalid("'messages' is required: send a list of {\"role\", \"content\"} objects", "missing_messages")
    messages = body["messages"]
    if not isinstance(messages, list) or not messages:
        raise invalid("'messages' must be a non-empty list of {\"role\", \"content\"} objects", "missing_messages")
    tools = [_openai_tool(t, f"tools[{i}]") for i, t in enumerate(list_field(body, "tools"))]
    choice, name = _openai_tool_choice(body.get("tool_choice"))
    return chat_request(
        [_message(m, i) for i, m in enumerate(messages)], tools=tools, tool_choice=choice, tool_name=name,
        parallel_tool_calls=boolean(body, "parallel_tool_calls") or False,
        json_schema=_response_format(body.get("response_format")), **_common(body),
    )


def chat_request(messages: list[dict], **fields) -> GenerationRequest:
    """The internal request of a chat, after the rules every API shares."""
    request = GenerationRequest(messages=messages, **fields)
    check_tool_history(messages)
    names = [t["function"]["name"] for t in request.tools]
    if len(set(names)) < len(names):
        raise invalid("two tools have the same name; give each function a name of its own", "invalid_tools")
    if request.tool_choice in ("required", "function") and not request.tools:
        raise invalid("a tool choice that forces a call needs 'tools'; send the tools or leave tool_choice out",
                      "invalid_tool_choice")
    if request.tool_choice == "function" and request.tool_name not in names:
        raise invalid(f"tool_choice names {request.tool_name!r}, which is not among the tools; "
                      f"use one of {', '.join(names)}", "invalid_tool_choice")
    if request.json_schema is not None and request.tools and request.tool_choice != "none":
        raise invalid("a JSON response format cannot be combined with tool calls; send tool_choice 'none' "
                      "or leave the response format out", "invalid_response_format")
    return request


def check_tool_history(messages: list[dict]) -> None:
    """Every tool result must answer a call that an earlier assistant message made."""
    calls: dict[str, str] = {}
    for message in messages:
        for call in message.get("tool_calls", ()):
            calls[call["id"]] = call["function"]["name"]
        if message["role"] == "tool":
            if message["tool_call_id"] not in calls:
                raise invalid(f"a tool result answers call id {message['tool_call_id']!r}, which no earlier "
                              "assistant message made; send the assistant's tool call before its result",
                              "unknown_tool_call_id")
            message.setdefault("name", calls[message["tool_call_id"]])


def function_tool(name: object, description: object, parameters: object, where: str) -> dict:
    """A function tool in the shape templates read, checked the same way whichever API sent it."""
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise invalid(f"{where}: the function name must be 1-64 letters, digits, '_', '.' or '-'", "invalid_tools")
    if description is not None and not isinstance(description, str):
        raise invalid(f"{where}: the description must be a string", "invalid_tools")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict) or parameters.get("type", "object") != "object":
        raise invalid(f"{where}: the parameters must be a JSON schema object with \"type\": \"object\"",
                      "invalid_tools")
    function = {"name": name, "parameters": parameters}
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def tool_call(call_id: object, name: object, arguments: object, where: str) -> dict:
    """An assistant's earlier tool call in the template shape; ``arguments`` an object or JSON text of one."""
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{where}: the call needs an 'id' string, the one its tool result refers to")
    if not isinstance(name, str) or not name:
        raise invalid(f"{where}: the call needs the function's name")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            arguments = None
    if not isinstance(arguments, dict):
        raise invalid(f"{where}: the arguments must be a JSON object (or the text of one)")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _openai_tool(tool: object, where: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
        raise invalid(f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", \"parameters\"}}}}; "
                      "only function tools are supported", "invalid_tools")
    function = tool["function"]
    return function_tool(function.get("name"), function.get("description"), function.get("parameters"), where)


def _openai_tool_choice(choice: object) -> tuple[str, str | None]:
    if choice is None or choice in TOOL_CHOICES:
        return choice or "auto", None
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict):
        return "function", choice["function"].get("name")
    raise invalid("'tool_choice' must be 'auto', 'none', 'required' or "
                  "{\"type\": \"function\", \"function\": {\"name\": ...}}", "invalid_tool_choice")


def _response_format(fmt: object) -> dict | None:
    if fmt is not None and not isinstance(fmt, dict):
        fmt = {"type": fmt}
    spec = (fmt or {}).get("json_schema")
    return answer_schema(fmt, spec.get("schema") if isinstance(spec, dict) else None, "response_format",
                         '{"type": "json_schema", "json_schema": {"name", "schema"}}')


def answer_schema(fmt: dict | None, schema: object, field: str, schema_form: str) -> dict | None:
    """The JSON schema a response format asks the answer to follow (None for plain text), for every API."""
    kind = fmt.get("type") if fmt else "text"
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema" and isinstance(schema, dict):
        return schema
    raise invalid(f"'{field}' must be {{\"type\": \"text\"}}, {{\"type\": \"json_object\"}} or {schema_form} "
                  "with a JSON schema object", "invalid_response_format")


def list_field(body: dict, name: str) -> list:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid(f"'{name}' must be a list")
    return value


def parse_completion_request(body: object) -> GenerationRequest:
    body = object_body(body)
    _refuse_unsupported(body, chat=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # the openai client sends a one-element list for a single prompt
    if not isinstance(prompt, str) or not prompt:
        raise invalid("'prompt' must be a non-empty string (one prompt per request; token ids are not accepted)")
    return GenerationRequest(prompt=prompt, api="completions", **_common(body))


def object_body(body: object) -> dict:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", "invalid_json")
    return body


def _refuse_unsupported(body: dict, *, chat: bool) -> None:
    n = integer(body, "n", minimum=1)
    if n is not None and n > 1:
        raise invalid("'n' > 1 is not supported: localspec generates one choice per request; send n=1")
    if body.get("functions") or body.get("function_call"):
        raise invalid("the deprecated 'functions' and 'function_call' are not supported; send 'tools' and "
                      "'tool_choice' instead", "unsupported_parameter")
    for name in ("frequency_penalty", "presence_penalty"):
        if number(body, name, -2.0, 2.0):
            raise invalid(f"'{name}' is not supported: leave it out or send 0", "unsupported_parameter")
    if body.get("logit_bias"):
        raise invalid("'logit_bias' is not supported: leave it out", "unsupported_parameter")
    if body.get("logprobs") or body.get("top_logprobs"):
        raise invalid("'logprobs' are not supported: leave them out", "unsupported_parameter")
    if not chat:
        if body.get("echo") or body.get("suffix"):
            raise invalid("'echo' and 'suffix' are not supported: leave them out", "unsupported_parameter")
        best_of = integer(body, "best_of", minimum=1)
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
    calls = message.get("tool_calls") if role == "assistant" else None
    if calls is not None and not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls must be a list")
    content = message.get("content")
    # An assistant turn that only calls tools has null content; templates read it as empty.
    parsed = {"role": role, "content": "" if content is None and calls else _content(content, where)}
    if calls:
        parsed["tool_calls"] = [_openai_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise invalid(f"{where}.tool_call_id must be the id of the tool call this message answers")
        parsed["tool_call_id"] = call_id
    return parsed


def _openai_call(call: object, where: str) -> dict:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise invalid(f"{where} must be {{\"id\", \"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}")
    return tool_call(call.get("id"), function.get("name"), function.get("arguments"), where)


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
    max_tokens = integer(body, "max_completion_tokens", minimum=1)
    if max_tokens is None:
        max_tokens = integer(body, "max_tokens", minimum=1)
    stream = boolean(body, "stream") or False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("'stream_options' must be an object such as {\"include_usage\": true}")
    include_usage = boolean(options or {}, "include_usage", "stream_options.include_usage") or False
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("'model' must be a string")
    return dict(
        max_tokens=max_tokens,
        temperature=number(body, "temperature", 0.0, 2.0),
        top_p=number(body, "top_p", 0.0, 1.0),
        top_k=integer(body, "top_k", minimum=0),
        min_p=number(body, "min_p", 0.0, 1.0),
        seed=integer(body, "seed", minimum=0),
        stop=stop_strings(body.get("stop")),
        stream=stream,
        include_usage=stream and include_usage,
    )


def stop_strings(stop: object, name: str = "stop") -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > MAX_STOP_STRINGS
            or not all(isinstance(s, str) and s for s in stop)):
        raise invalid(f"'{name}' must be a non-empty string or a list of up to {MAX_STOP_STRINGS} non-empty strings")
    return tuple(stop)


def number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    # bool is an int in Python, but true is not a temperature.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise invalid(f"'{name}' must be a number from {low:g} to {high:g}")
    return float(value)


def integer(body: dict, name: str, *, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer() and math.isfinite(value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        raise invalid(f"'{name}' must be an integer" + (f" of at least {minimum}" if minimum is not None else ""))
    return value


def boolean(body: dict, name: str, label: str | None = None) -> bool | None:
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
    """Bodies of /v1/chat/completions: ``chat.completion`` and ``chat.completion.chunk`` objects.

    Tool calls stream as OpenAI's deltas: ``index``, then ``id``, ``type`` and ``name`` once, then
    fragments of ``arguments`` to concatenate.
    """

    done_marker = True  # OpenAI ends its streams with "data: [DONE]"

    def __init__(self, model: str, *, include_usage: bool = False) -> None:
        self.model, self.id, self.created = model, new_id("chatcmpl"), now()
        self.include_usage = include_usage

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _reason(self, done) -> str:
        reason = finish_reason(done.stats)
        return "tool_calls" if done.called and reason == "stop" else reason

    def response(self, events: list, done) -> dict:
        content, calls = collect(events)
        message = {"role": "assistant", "content": content if content or not calls else None}
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return {
            **self._head("chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": self._reason(done)}],
            "usage": usage(done.stats),
            "timings": timings(done.stats, done.method),
        }

    def _chunk(self, delta: dict) -> dict:
        body = {**self._head("chat.completion.chunk"), "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        return {**body, "usage": None} if self.include_usage else body

    def stream_start(self) -> list:
        return [(None, self._chunk({"role": "assistant", "content": ""}))]

    def stream_event(self, event) -> list:
        if isinstance(event, CallDelta):
            call = {"index": event.index, "function": {"arguments": event.arguments}}
            if event.id is not None:
                call = {"index": event.index, "id": event.id, "type": "function",
                        "function": {"name": event.name, "arguments": event.arguments}}
            return [(None, self._chunk({"tool_calls": [call]}))]
        return [(None, self._chunk({"content": event.text}))]

    def stream_end(self, done) -> list:
        last = {**self._head("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": {}, "finish_reason": self._reason(done)}],
                "timings": timings(done.stats, done.method)}
        if not self.include_usage:
            return [(None, last)]
        # OpenAI's usage chunk comes after the finish reason, with no choices; the figures ride on it too.
        figures = {**self._head("chat.completion.chunk"), "choices": [], "usage": usage(done.stats),
                   "timings": last["timings"]}
        return [(None, {**last, "usage": None}), (None, figures)]

    def stream_error(self, error: APIError) -> tuple:
        return None, error.body()


class CompletionFormat:
    """Bodies of /v1/completions: ``text_completion`` objects, streamed or whole."""

    done_marker = True

    def __init__(self, model: str, *, include_usage: bool = False) -> None:
        self.model, self.id, self.created = model, new_id("cmpl"), now()
        self.include_usage = include_usage

    def _body(self, text: str, reason: str | None) -> dict:
        return {"id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}

    def response(self, events: list, done) -> dict:
        text, _ = collect(events)
        return {**self._body(text, finish_reason(done.stats)), "usage": usage(done.stats),
                "timings": timings(done.stats, done.method)}

    def _chunk(self, text: str) -> dict:
        body = self._body(text, None)
        return {**body, "usage": None} if self.include_usage else body

    def stream_start(self) -> list:
        return [(None, self._chunk(""))]

    def stream_event(self, event) -> list:
        return [(None, self._chunk(event.text))]

    def stream_end(self, done) -> list:
        last = {**self._body("", finish_reason(done.stats)), "timings": timings(done.stats, done.method)}
        if not self.include_usage:
            return [(None, last)]
        figures = {**self._body("", None), "choices": [], "usage": usage(done.stats), "timings": last["timings"]}
        return [(None, {**last, "usage": None}), (None, figures)]

    def stream_error(self, error: APIError) -> tuple:
        return None, error.body()


def collect(events: list) -> tuple[str, list[ToolCall]]:
    """The text and the whole tool calls of an answer's events (``TextDelta`` and ``CallDelta``)."""
    return collect_calls(list(events))
