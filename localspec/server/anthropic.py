"""The Anthropic Messages API (/v1/messages), for Claude Code and the Anthropic SDKs: a thin translation.

A request becomes the one internal ``GenerationRequest`` (schema.py): the system prompt a system message,
``tool_use`` blocks assistant tool calls, ``tool_result`` blocks tool messages. The answer's events come
back as Anthropic's content blocks, streamed in its event order (message_start, content_block_start /
_delta / _stop per block, message_delta with the stop reason and usage, message_stop). Errors use
Anthropic's shape (``APIError.anthropic_body``).
"""

from __future__ import annotations

import json

from localspec.server import schema
from localspec.server.schema import APIError, GenerationRequest, invalid, new_id, timings
from localspec.tool_calls import CallDelta

_CHOICES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}


# -- requests --------------------------------------------------------------------------------------------
def parse_messages_request(body: object, *, count_only: bool = False) -> GenerationRequest:
    body = schema.object_body(body)
    if not count_only and body.get("max_tokens") is None:
        raise invalid("'max_tokens' is required: send the most tokens the answer may have")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise invalid("'messages' must be a non-empty list of {\"role\", \"content\"} objects", "missing_messages")
    messages = _system(body.get("system"))
    for i, message in enumerate(body["messages"]):
        messages += _message(message, f"messages[{i}]")
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(schema.list_field(body, "tools"))]
    choice, name, parallel = _tool_choice(body.get("tool_choice"))
    stops = schema.list_field(body, "stop_sequences")
    return schema.chat_request(
        messages, api="messages", tools=tools, tool_choice=choice, tool_name=name, parallel_tool_calls=parallel,
        max_tokens=schema.integer(body, "max_tokens", minimum=1),
        temperature=schema.number(body, "temperature", 0.0, 1.0),
        top_p=schema.number(body, "top_p", 0.0, 1.0),
        top_k=schema.integer(body, "top_k", minimum=0),
        stop=schema.stop_strings(stops or None, "stop_sequences"),
        stream=schema.boolean(body, "stream") or False,
    )


def _system(system: object) -> list[dict]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        return [{"role": "system", "content": "".join(_text(b, f"system[{i}]") for i, b in enumerate(system))}]
    raise invalid("'system' must be a string or a list of text blocks")


def _text(block: object, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise invalid(f"{where} must be a text block {{\"type\": \"text\", \"text\": ...}}")
    return block["text"]


def _message(message: object, where: str) -> list[dict]:
    """One Anthropic message as chat-template messages (a user turn's tool results become tool messages)."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
        raise invalid(f"{where} must be an object with 'role' 'user' or 'assistant' and 'content'", "invalid_role")
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be a string or a list of content blocks")
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use" and role == "assistant":
            calls.append(schema.tool_call(block.get("id"), block.get("name"), block.get("input"), at))
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise invalid(f"{at}.tool_use_id must be the id of the tool_use block this result answers")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _result_text(block.get("content"), at)})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # an earlier answer's reasoning; the template has no place for it
        else:
            raise invalid(f"{at}: {kind!r} blocks are not supported in {role} messages; send text, tool_use "
                          "(assistant) or tool_result (user) blocks")
    out = results
    if role == "assistant":
        out.append({"role": "assistant", "content": "".join(texts), **({"tool_calls": calls} if calls else {})})
    elif texts or not results:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _result_text(content: object, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(_text(b, f"{where}.content[{i}]") for i, b in enumerate(content))
    raise invalid(f"{where}.content must be a string or a list of text blocks")


def _tool(tool: object, where: str) -> dict:
    if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise invalid(f"{where}: {kind!r} tools are Anthropic's own server tools; send custom tools "
                      "{\"name\", \"description\", \"input_schema\"}", "invalid_tools")
    return schema.function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), where)


def _tool_choice(choice: object) -> tuple[str, str | None, bool]:
    if choice is None:
        return "auto", None, False
    if not isinstance(choice, dict) or choice.get("type") not in _CHOICES:
        raise invalid("'tool_choice' must be {\"type\": \"auto\"}, {\"type\": \"any\"}, {\"type\": \"none\"} or "
                      "{\"type\": \"tool\", \"name\": ...}", "invalid_tool_choice")
    # One call per answer unless parallel use is asked for explicitly (see GenerationRequest).
    parallel = choice.get("disable_parallel_tool_use") is False
    return _CHOICES[choice["type"]], choice.get("name"), parallel


# -- answers ---------------------------------------------------------------------------------------------
def stop_reason(done) -> str:
    if done.stats.stop_reason in ("length", "context_full"):
        return "max_tokens"
    if done.called:
        return "tool_use"
    return "stop_sequence" if done.stop else "end_turn"


def _usage(done) -> dict:
    stats = done.stats
    return {"input_tokens": stats.prefill_tokens, "output_tokens": stats.generated_tokens,
            "cache_read_input_tokens": stats.prompt_tokens - stats.prefill_tokens}


def _input(arguments: str) -> dict:
    # A call cut short by max_tokens has incomplete arguments; tool_use.input must still be an object.
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class MessagesFormat:
    """Bodies and stream events of /v1/messages; ``timings`` (localspec's figures) ride on the message and
    on the message_delta event, as extra fields Anthropic's clients ignore."""

    done_marker = False

    def __init__(self, model: str) -> None:
        self.model, self.id = model, new_id("msg")
        self._block = -1  # index of the open content block, -1 before the first
        self._open: str | None = None  # its type

    def response(self, events: list, done) -> dict:
        content, calls = schema.collect(events)
        blocks = [{"type": "text", "text": content}] if content or not calls else []
        blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)} for c in calls]
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": blocks,
                "stop_reason": stop_reason(done), "stop_sequence": done.stop, "usage": _usage(done),
                "timings": timings(done.stats, done.method)}

    def stream_start(self) -> list:
        message = {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
        return [("message_start", {"type": "message_start", "message": message}), ("ping", {"type": "ping"})]

    def _start(self, block: dict) -> list:
        events = self._close()
        self._block += 1
        self._open = block["type"]
        return events + [("content_block_start", {"type": "content_block_start", "index": self._block,
                                                   "content_block": block})]

    def _close(self) -> list:
        if self._open is None:
            return []
        self._open = None
        return [("content_block_stop", {"type": "content_block_stop", "index": self._block})]

    def _delta(self, delta: dict) -> tuple:
        return "content_block_delta", {"type": "content_block_delta", "index": self._block, "delta": delta}

    def stream_event(self, event) -> list:
        if isinstance(event, CallDelta):
            events = []
            if event.id is not None:
                events = self._start({"type": "tool_use", "id": event.id, "name": event.name, "input": {}})
            if event.arguments:
                events.append(self._delta({"type": "input_json_delta", "partial_json": event.arguments}))
            return events
        events = [] if self._open == "text" else self._start({"type": "text", "text": ""})
        return events + [self._delta({"type": "text_delta", "text": event.text})]

    def stream_end(self, done) -> list:
        events = self._close() if self._block >= 0 else self._start({"type": "text", "text": ""}) + self._close()
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason(done), "stop_sequence": done.stop},
                 "usage": _usage(done), "timings": timings(done.stats, done.method)}
        return events + [("message_delta", delta), ("message_stop", {"type": "message_stop"})]

    def stream_error(self, error: APIError) -> tuple:
        return "error", error.anthropic_body()


def count_tokens_body(tokens: int) -> dict:
    return {"input_tokens": tokens}
