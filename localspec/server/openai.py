"""OpenAI's chat completions (/v1/chat/completions) and completions (/v1/completions): a thin translation.

A chat body becomes the one internal ``GenerationRequest`` (request.py) almost as it is: its messages and
tools already have the shape chat templates read. Fields that would change the answer but that localspec
cannot honour (``n`` > 1, penalties, logprobs...) are refused; fields that do not change it (``user``,
``model``...) are accepted. A completion with a ``suffix`` fills in the middle with the model's FIM tokens
(fim.py). The answer's events come back as ``chat.completion`` objects or chunks (with
the model's reasoning as ``reasoning_content``, as llama-server sends it) or ``text_completion`` objects.
"""

from __future__ import annotations

from localspec.fim import FimRequest
from localspec.server.reasoning import ReasoningDelta
from localspec.server.request import (
    NO_REASONING, ROLE_ALIASES, ROLES, TOOL_CHOICES, APIError, GenerationRequest, answer_schema, boolean,
    chat_request, function_tool, ignore_hosted, integer, invalid, list_field, number, object_body, stop_strings,
    tool_call,
)
from localspec.server.results import cached_tokens, collect, new_id, now, timings, truncated
from localspec.tool_calls import CallDelta

# Fields that only steer OpenAI's hosted service.
_HOSTED_FIELDS = ("metadata", "store", "prompt_cache_key", "prompt_cache_retention", "service_tier", "user",
                  "safety_identifier", "prediction", "verbosity")


# -- requests --------------------------------------------------------------------------------------------
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
    ignore_hosted("chat.completions", body, _HOSTED_FIELDS)
    return chat_request(
        [_message(m, i) for i, m in enumerate(messages)], tools=tools, tool_choice=choice, tool_name=name,
        parallel_tool_calls=boolean(body, "parallel_tool_calls") or False,
        json_schema=_response_format(body.get("response_format")), thinking=_thinking(body), **_common(body),
    )


def _thinking(body: dict) -> bool | None:
    """The thinking switch: ``reasoning_effort``, or llama-server's ``chat_template_kwargs.enable_thinking``."""
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict) and kwargs.get("enable_thinking") is not None:
        return boolean(kwargs, "enable_thinking", "chat_template_kwargs.enable_thinking")
    effort = body.get("reasoning_effort")
    if effort is None:
        return None
    if not isinstance(effort, str):
        raise invalid("'reasoning_effort' must be a string such as \"none\", \"low\" or \"high\"")
    return effort not in NO_REASONING


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


def parse_completion_request(body: object) -> GenerationRequest:
    body = object_body(body)
    _refuse_unsupported(body, chat=False)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # the openai client sends a one-element list for a single prompt
    suffix = body.get("suffix")
    if suffix is not None:
        # Insert between the prompt and the suffix: /infill's FIM prompt without other files' chunks.
        if not isinstance(suffix, str) or not isinstance(prompt, str):
            raise invalid("'suffix' and 'prompt' must be strings: the text after and before the insertion")
        return GenerationRequest(fim=FimRequest(prefix=prompt, suffix=suffix), api="completions", **_common(body))
    if not isinstance(prompt, str) or not prompt:
        raise invalid("'prompt' must be a non-empty string (one prompt per request; token ids are not accepted)")
    return GenerationRequest(prompt=prompt, api="completions", **_common(body))


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
        if body.get("echo"):
            raise invalid("'echo' is not supported: leave it out", "unsupported_parameter")
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
    if role == "assistant" and isinstance(message.get("reasoning_content"), str):
        parsed["reasoning_content"] = message["reasoning_content"]  # thinking templates may show it again
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


# -- answers ---------------------------------------------------------------------------------------------
def finish_reason(done) -> str:
    """OpenAI's reason: ``length`` when the token budget or the context ran out, ``tool_calls``, else ``stop``."""
    if truncated(done.stats):
        return "length"
    return "tool_calls" if done.called else "stop"


def usage(stats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.generated_tokens,
        "total_tokens": stats.prompt_tokens + stats.generated_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens(stats)},
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

    def response(self, events: list, done) -> dict:
        reasoning, content, calls = collect(events)
        message = {"role": "assistant", "content": content if content or not calls else None}
        if reasoning:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        return {
            **self._head("chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(done)}],
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
        if isinstance(event, ReasoningDelta):
            return [(None, self._chunk({"reasoning_content": event.text}))]
        return [(None, self._chunk({"content": event.text}))]

    def stream_keepalive(self) -> list:
        return []  # OpenAI's streams have no keepalive event; the SSE comment does

    def stream_end(self, done) -> list:
        last = {**self._head("chat.completion.chunk"),
                "choices": [{"index": 0, "delta": {}, "finish_reason": finish_reason(done)}],
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
        _, text, _ = collect(events)
        return {**self._body(text, finish_reason(done)), "usage": usage(done.stats),
                "timings": timings(done.stats, done.method)}

    def _chunk(self, text: str) -> dict:
        body = self._body(text, None)
        return {**body, "usage": None} if self.include_usage else body

    def stream_start(self) -> list:
        return [(None, self._chunk(""))]

    def stream_event(self, event) -> list:
        return [(None, self._chunk(event.text))]

    def stream_keepalive(self) -> list:
        return []

    def stream_end(self, done) -> list:
        last = {**self._body("", finish_reason(done)), "timings": timings(done.stats, done.method)}
        if not self.include_usage:
            return [(None, last)]
        figures = {**self._body("", None), "choices": [], "usage": usage(done.stats), "timings": last["timings"]}
        return [(None, {**last, "usage": None}), (None, figures)]

    def stream_error(self, error: APIError) -> tuple:
        return None, error.body()
