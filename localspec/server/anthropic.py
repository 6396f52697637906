"""The Anthropic Messages API (/v1/messages), for Claude Code and the Anthropic SDKs: a thin translation.

A request becomes the one internal ``GenerationRequest`` (request.py): the system prompt and ``system``
messages system messages, ``tool_use`` blocks assistant tool calls, ``tool_result`` blocks tool messages,
``thinking`` the template's thinking switch. The answer's events come back as Anthropic's content blocks
(the model's reasoning as ``thinking`` blocks), streamed in its event order (message_start,
content_block_start / _delta / _stop per block, message_delta with the stop reason and usage,
message_stop). Errors use Anthropic's shape (``APIError.anthropic_body``).
"""

from __future__ import annotations

import json
import logging

from localspec.server import request as fields
from localspec.server.reasoning import ReasoningDelta
from localspec.server.request import APIError, GenerationRequest, invalid
from localspec.server.results import cached_tokens, collect, new_id, timings, truncated
from localspec.tool_calls import CallDelta

log = logging.getLogger("localspec.server")

_CHOICES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}
# Fields that only steer Anthropic's hosted service (cache hints ride on blocks and are ignored there too).
_HOSTED_FIELDS = ("metadata", "context_management", "output_config", "service_tier", "container",
                  "inference_geo", "mcp_servers")
# Anthropic's server tools run on its side; the server cannot run them, so they are left out.
_SERVER_TOOLS = ("web_search", "web_fetch", "code_execution", "tool_search", "mcp_toolset")
# Claude Code's first system block is billing attribution for Anthropic's service, hashed from the request
# (it differs between conversations, and in some releases between turns); at the front of the prompt it
# would keep any two conversations from sharing their system prompt and tools in the prompt cache.
_ATTRIBUTION = "x-anthropic-billing-header:"


# -- requests --------------------------------------------------------------------------------------------
def parse_messages_request(body: object, *, count_only: bool = False) -> GenerationRequest:
    body = fields.object_body(body)
    if not count_only and body.get("max_tokens") is None:
        raise invalid("'max_tokens' is required: send the most tokens the answer may have")
    if not isinstance(body.get("messages"), list) or not body["messages"]:
        raise invalid("'messages' must be a non-empty list of {\"role\", \"content\"} objects", "missing_messages")
    messages = _system(body.get("system"))
    for i, message in enumerate(body["messages"]):
        messages += _message(message, f"messages[{i}]")
    tools, left_out = [], []
    for i, tool in enumerate(fields.list_field(body, "tools")):
        offered = _tool(tool, f"tools[{i}]")
        if offered is None:
            left_out.append(tool.get("name") or tool.get("type"))
        else:
            tools.append(offered)
    fields.leave_out_tools("messages", left_out)
    fields.ignore_hosted("messages", body, _HOSTED_FIELDS)
    choice, name, parallel = _tool_choice(body.get("tool_choice"))
    stops = fields.list_field(body, "stop_sequences")
    return fields.chat_request(
        messages, api="messages", tools=tools, tool_choice=choice, tool_name=name, parallel_tool_calls=parallel,
        max_tokens=fields.integer(body, "max_tokens", minimum=1),
        temperature=fields.number(body, "temperature", 0.0, 1.0),
        top_p=fields.number(body, "top_p", 0.0, 1.0),
        top_k=fields.integer(body, "top_k", minimum=0),
        stop=fields.stop_strings(stops or None, "stop_sequences"),
        stream=fields.boolean(body, "stream") or False,
        thinking=_thinking(body.get("thinking")),
    )


def _thinking(thinking: object) -> bool | None:
    if thinking is None:
        return None
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if kind not in ("enabled", "adaptive", "disabled"):
        raise invalid("'thinking' must be {\"type\": \"enabled\"}, {\"type\": \"adaptive\"} or "
                      "{\"type\": \"disabled\"}")
    return kind != "disabled"


def _system(system: object) -> list[dict]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    if isinstance(system, list):
        texts = [_text(b, f"system[{i}]") for i, b in enumerate(system)]
        kept = [text for text in texts if not text.startswith(_ATTRIBUTION)]
        if len(kept) < len(texts):
            log.debug("messages: left out the system block that only carries billing attribution")
        return [{"role": "system", "content": "".join(kept)}] if kept else []
    raise invalid("'system' must be a string or a list of text blocks")


def _text(block: object, where: str) -> str:
    if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
        raise invalid(f"{where} must be a text block {{\"type\": \"text\", \"text\": ...}}")
    return block["text"]


def _message(message: object, where: str) -> list[dict]:
    """One Anthropic message as chat-template messages (a user turn's tool results become tool messages)."""
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise invalid(f"{where} must be an object with 'role' 'user', 'assistant' or 'system' and 'content'",
                      "invalid_role")
    role, content = message["role"], message.get("content")
    if role == "system":  # Claude Code sends its environment this way, between the turns
        return _system(content)
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise invalid(f"{where}.content must be a string or a list of content blocks")
    texts, calls, results, thoughts = [], [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text(block, at))
        elif kind == "tool_use" and role == "assistant":
            calls.append(fields.tool_call(block.get("id"), block.get("name"), block.get("input"), at))
        elif kind == "tool_result" and role == "user":
            if not isinstance(block.get("tool_use_id"), str):
                raise invalid(f"{at}.tool_use_id must be the id of the tool_use block this result answers")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": _result_text(block.get("content"), at)})
        elif kind == "thinking" and role == "assistant" and isinstance(block.get("thinking"), str):
            thoughts.append(block["thinking"])  # an earlier answer's reasoning, for templates that show it
        elif kind == "redacted_thinking" and role == "assistant":
            continue  # encrypted by Anthropic's service: nothing a local model can read
        else:
            raise invalid(f"{at}: {kind!r} blocks are not supported in {role} messages; send text, tool_use "
                          "(assistant) or tool_result (user) blocks")
    out = results
    if role == "assistant":
        answer = {"role": "assistant", "content": "".join(texts)}
        if thoughts:
            answer["reasoning_content"] = "".join(thoughts)
        out.append({**answer, **({"tool_calls": calls} if calls else {})})
    elif texts or not results:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _result_text(content: object, where: str) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        return "".join(_text(b, f"{where}.content[{i}]") for i, b in enumerate(content))
    raise invalid(f"{where}.content must be a string or a list of text blocks")


def _tool(tool: object, where: str) -> dict | None:
    """A custom tool as a function tool; None for a tool left out (a server tool, or one loaded on demand)."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if isinstance(kind, str) and kind.startswith(_SERVER_TOOLS):
        return None
    if kind not in (None, "custom"):
        raise invalid(f"{where}: {kind!r} tools have no schema the server knows; send custom tools "
                      "{\"name\", \"description\", \"input_schema\"}", "invalid_tools")
    if tool.get("defer_loading") is True:
        return None  # offered only once Anthropic's tool search finds it, which is a server tool
    return fields.function_tool(tool.get("name"), tool.get("description"), tool.get("input_schema"), where)


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
    if truncated(done.stats):
        return "max_tokens"
    if done.called:
        return "tool_use"
    return "stop_sequence" if done.stop else "end_turn"


def _usage(done) -> dict:
    stats = done.stats
    return {"input_tokens": stats.prefill_tokens, "output_tokens": stats.generated_tokens,
            "cache_read_input_tokens": cached_tokens(stats)}


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
        reasoning, content, calls = collect(events)
        blocks = [{"type": "thinking", "thinking": reasoning, "signature": ""}] if reasoning else []
        blocks += [{"type": "text", "text": content}] if content or not (calls or reasoning) else []
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
        if isinstance(event, ReasoningDelta):
            opened = self._open == "thinking"
            events = [] if opened else self._start({"type": "thinking", "thinking": "", "signature": ""})
            return events + [self._delta({"type": "thinking_delta", "thinking": event.text})]
        events = [] if self._open == "text" else self._start({"type": "text", "text": ""})
        return events + [self._delta({"type": "text_delta", "text": event.text})]

    def stream_keepalive(self) -> list:
        return [("ping", {"type": "ping"})]

    def stream_end(self, done) -> list:
        events = self._close() if self._block >= 0 else self._start({"type": "text", "text": ""}) + self._close()
        delta = {"type": "message_delta", "delta": {"stop_reason": stop_reason(done), "stop_sequence": done.stop},
                 "usage": _usage(done), "timings": timings(done.stats, done.method)}
        return events + [("message_delta", delta), ("message_stop", {"type": "message_stop"})]

    def stream_error(self, error: APIError) -> tuple:
        return "error", error.anthropic_body()


def count_tokens_body(tokens: int) -> dict:
    return {"input_tokens": tokens}
