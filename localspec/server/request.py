"""The one internal request every API translates into, its errors, and the rules the APIs share.

Every API (openai.py, anthropic.py, responses.py) translates its body into one ``GenerationRequest``:
messages in the shape Hugging Face chat templates read (assistant ``tool_calls`` with arguments as an
object, ``role: "tool"`` results), tools as OpenAI function tools. The rules shared by the APIs (a tool's
shape, tool results answering earlier calls, tool_choice against tools, reading a field) are written here
once. The checks are written out rather than left to a schema library so that every rejection is one
message naming the field and what to send instead.

What changes an answer and cannot be honoured is refused; what only steers a hosted service (metadata,
cache hints, stored responses...) is accepted and named in a debug log line (``ignore_hosted``); any
other unknown field is ignored.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass, field

from localspec.fim import FimRequest

log = logging.getLogger("localspec.server")

ROLES = ("system", "user", "assistant", "tool")
# Newer OpenAI clients send "developer" where older ones sent "system".
ROLE_ALIASES = {"developer": "system"}
# Reasoning efforts (OpenAI's ``reasoning_effort`` and Responses ``reasoning.effort``) that turn thinking off.
NO_REASONING = ("none", "minimal")
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
    fim: FimRequest | None = None  # fill in the middle: the prompt is built from the model's FIM tokens
    # An editor's limits on the answer (fim.CompletionLimits; 0: off).
    n_indent: int = 0
    t_max_predict_ms: int = 0
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
    infill_sampler: bool = False  # llama.cpp's infill sampler after the filters (editors' /infill requests)
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    # Whether the model thinks before answering, where its template has the switch (None: its default).
    thinking: bool | None = None
    # Tools offered under another name than the client's: offered name -> (namespace, client's name).
    tool_namespaces: dict[str, tuple[str, str]] = field(default_factory=dict)

    @property
    def offered_tools(self) -> list[dict]:
        """The tools the model is shown: none with tool_choice 'none', which keeps calls out of the answer."""
        return self.tools if self.tool_choice != "none" else []

    def sampling_overrides(self) -> dict:
        fields = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                  "min_p": self.min_p, "seed": self.seed}
        return {name: value for name, value in fields.items() if value is not None}


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


def ignore_hosted(api: str, body: dict, names: tuple[str, ...]) -> None:
    """Log the fields of ``body`` among ``names``: they only steer a hosted service, so they are ignored."""
    present = [name for name in names if body.get(name) is not None]
    if present:
        log.debug("%s: ignored what only a hosted service uses: %s", api, ", ".join(present))


def leave_out_tools(api: str, kinds: list[str]) -> None:
    """Log the hosted tools (web search, code interpreter...) a request offered: the server cannot run them."""
    if kinds:
        log.info("%s: left out tools the server cannot run: %s", api, ", ".join(kinds))


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


def object_body(body: object) -> dict:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", "invalid_json")
    return body


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
