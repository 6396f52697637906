"""The OpenAI Responses API (/v1/responses), for the Codex CLI and newer SDKs: a thin translation.

``input`` (a string, or items: messages, ``function_call`` and ``function_call_output``) and
``instructions`` become the one internal ``GenerationRequest`` (request.py), ``reasoning.effort`` the
template's thinking switch. A ``namespace`` tool's functions are offered to the model as
``NAMESPACE.NAME`` and called back under the client's namespace and name. The answer's events come back
as output items (a ``reasoning`` item, a ``message`` with ``output_text``, ``function_call`` items) and,
streamed, as the Responses event sequence: response.created, response.in_progress, per item
output_item.added ... deltas ... output_item.done, then response.completed (or response.incomplete).
Nothing is stored, so ``previous_response_id`` is refused with a 400 that says to resend the conversation.
"""

from __future__ import annotations

from localspec.server import request as fields
from localspec.server.reasoning import ReasoningDelta
from localspec.server.request import APIError, GenerationRequest, invalid
from localspec.server.results import cached_tokens, collect, new_id, now, timings, truncated
from localspec.tool_calls import CallDelta

_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")
# Items an earlier answer carries that the model cannot read again: encrypted reasoning, hosted tools' calls.
_SKIPPED_ITEMS = ("reasoning", "web_search_call", "file_search_call", "code_interpreter_call", "image_generation_call")
# Tools OpenAI's service runs; the server cannot, so they are left out.
_HOSTED_TOOLS = ("web_search", "web_search_preview", "file_search", "code_interpreter", "image_generation", "mcp",
                 "computer_use_preview", "tool_search")
# Fields that only steer OpenAI's hosted service.
_HOSTED_FIELDS = ("store", "include", "prompt_cache_key", "prompt_cache_retention", "client_metadata", "metadata",
                  "service_tier", "user", "safety_identifier", "truncation", "background", "context_management")


# -- requests --------------------------------------------------------------------------------------------
def parse_responses_request(body: object) -> GenerationRequest:
    body = fields.object_body(body)
    if body.get("previous_response_id") is not None:
        raise invalid("'previous_response_id' is not supported: localspec stores no responses; send the whole "
                      "conversation in 'input' (and 'store': false)", "unsupported_parameter")
    messages = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("'instructions' must be a string")
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise invalid("'input' must be a non-empty string or list of input items", "missing_input")
    for i, item in enumerate(items):
        _add_item(messages, item, f"input[{i}]")
    tools, namespaces, left_out = [], {}, []
    for i, tool in enumerate(fields.list_field(body, "tools")):
        _add_tool(tools, namespaces, left_out, tool, f"tools[{i}]")
    fields.leave_out_tools("responses", left_out)
    fields.ignore_hosted("responses", body, _HOSTED_FIELDS)
    choice, name = _tool_choice(body.get("tool_choice"))
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    return fields.chat_request(
        messages, api="responses", tools=tools, tool_choice=choice, tool_name=name,
        parallel_tool_calls=fields.boolean(body, "parallel_tool_calls") or False,
        json_schema=_text_format(fmt),
        max_tokens=fields.integer(body, "max_output_tokens", minimum=1),
        temperature=fields.number(body, "temperature", 0.0, 2.0),
        top_p=fields.number(body, "top_p", 0.0, 1.0),
        stream=fields.boolean(body, "stream") or False,
        thinking=_thinking(body.get("reasoning")), tool_namespaces=namespaces,
    )


def _thinking(reasoning: object) -> bool | None:
    if reasoning is None:
        return None
    if not isinstance(reasoning, dict):
        raise invalid("'reasoning' must be an object such as {\"effort\": \"low\"}")
    effort = reasoning.get("effort")
    if effort is None:
        return None  # only a summary asked for: the template's default
    if not isinstance(effort, str):
        raise invalid("'reasoning.effort' must be a string such as \"none\", \"low\" or \"high\"")
    return effort not in fields.NO_REASONING


def qualified_name(namespace: str | None, name: object) -> object:
    """The name a namespace's function is offered to the model under."""
    return f"{namespace}.{name}" if namespace else name


def _add_item(messages: list[dict], item: object, where: str) -> None:
    if not isinstance(item, dict):
        raise invalid(f"{where} must be an input item object")
    kind = item.get("type", "message")
    if kind == "message":
        role = _ROLES.get(item.get("role"))
        if role is None:
            raise invalid(f"{where}.role must be one of user, assistant, system, developer", "invalid_role")
        messages.append({"role": role, "content": _content(item.get("content"), where)})
    elif kind == "function_call":
        name = qualified_name(item.get("namespace"), item.get("name"))
        call = fields.tool_call(item.get("call_id"), name, item.get("arguments"), where)
        last = messages[-1] if messages else None
        # Calls made in one answer (and its text before them) are one assistant message.
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
            raise invalid(f"{where}: a function_call_output needs 'call_id' and 'output' strings")
        messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
    elif kind not in _SKIPPED_ITEMS:
        raise invalid(f"{where}: {kind!r} items are not supported; send messages, function_call and "
                      "function_call_output items")


def _content(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            text = part.get("text") if isinstance(part, dict) else None
            if not isinstance(text, str) or part.get("type") not in _TEXT_PARTS:
                raise invalid(f"{where}.content[{j}]: only text parts (input_text, output_text) are supported")
            texts.append(text)
        return "".join(texts)
    raise invalid(f"{where}.content must be a string or a list of text parts")


def _add_tool(tools: list[dict], namespaces: dict, left_out: list[str], tool: object, where: str) -> None:
    """Add ``tool`` to the offered ``tools``: a function, a namespace's functions, or nothing for a hosted tool."""
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind in _HOSTED_TOOLS:
        left_out.append(kind)
    elif kind == "namespace" and isinstance(tool.get("name"), str) and isinstance(tool.get("tools"), list):
        for j, member in enumerate(tool["tools"]):
            if not isinstance(member, dict) or member.get("type") != "function":
                raise invalid(f"{where}.tools[{j}]: a namespace may hold only function tools here", "invalid_tools")
            offered = qualified_name(tool["name"], member.get("name"))
            tools.append(fields.function_tool(offered, member.get("description"), member.get("parameters"),
                                              f"{where}.tools[{j}]"))
            namespaces[offered] = (tool["name"], member["name"])
    elif kind == "function":
        tools.append(fields.function_tool(tool.get("name"), tool.get("description"), tool.get("parameters"), where))
    else:
        raise invalid(f"{where}: {kind!r} tools are not supported; send function tools "
                      "{\"type\": \"function\", \"name\", \"parameters\"} or namespaces of them", "invalid_tools")


def _tool_choice(choice: object) -> tuple[str, str | None]:
    if choice is None or choice in fields.TOOL_CHOICES:
        return choice or "auto", None
    if isinstance(choice, dict) and choice.get("type") == "function":
        return "function", choice.get("name")
    raise invalid("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}",
                  "invalid_tool_choice")


def _text_format(fmt: object) -> dict | None:
    if fmt is not None and not isinstance(fmt, dict):
        fmt = {"type": fmt}
    return fields.answer_schema(fmt, (fmt or {}).get("schema"), "text.format",
                                '{"type": "json_schema", "name", "schema"}')


# -- answers ---------------------------------------------------------------------------------------------
class ResponsesFormat:
    """Bodies and stream events of /v1/responses; ``timings`` ride on the response object."""

    done_marker = False

    def __init__(self, model: str, request: GenerationRequest) -> None:
        self.model, self.id, self.created = model, new_id("resp"), now()
        self.request = request
        self._items: list[dict] = []  # output items so far (streaming)
        self._sequence = 0

    def _response(self, status: str, output: list[dict], done=None) -> dict:
        body = {
            "id": self.id, "object": "response", "created_at": self.created, "status": status, "model": self.model,
            "output": output, "error": None, "incomplete_details": None, "instructions": None,
            "parallel_tool_calls": self.request.parallel_tool_calls, "tool_choice": self.request.tool_choice
            if self.request.tool_choice != "function" else {"type": "function", "name": self.request.tool_name},
            "tools": [{"type": "function", **t["function"]} for t in self.request.tools],
            "store": False, "usage": None,
        }
        if done is not None:
            stats = done.stats
            if truncated(stats):
                body["status"], body["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
            body["usage"] = {"input_tokens": stats.prompt_tokens, "output_tokens": stats.generated_tokens,
                             "total_tokens": stats.prompt_tokens + stats.generated_tokens,
                             "input_tokens_details": {"cached_tokens": cached_tokens(stats)},
                             "output_tokens_details": {"reasoning_tokens": 0}}
            body["timings"] = timings(stats, done.method)
        return body

    def response(self, events: list, done) -> dict:
        reasoning, content, calls = collect(events)
        output = [_reasoning(new_id("rs"), reasoning, "completed")] if reasoning else []
        output += [_message(new_id("msg"), content, "completed")] if content or not (calls or reasoning) else []
        output += [self._function_call(c.id, c.name, c.arguments, "completed") for c in calls]
        return self._response("completed", output, done)

    def _function_call(self, call_id: str, name: str, arguments: str, status: str) -> dict:
        item = {"type": "function_call", "id": "fc_" + call_id.removeprefix("call_"), "call_id": call_id,
                "name": name, "arguments": arguments, "status": status}
        if name in self.request.tool_namespaces:
            item["namespace"], item["name"] = self.request.tool_namespaces[name]
        return item

    def _event(self, kind: str, **fields) -> tuple:
        self._sequence += 1
        return kind, {"type": kind, "sequence_number": self._sequence - 1, **fields}

    def stream_start(self) -> list:
        return [self._event("response.created", response=self._response("in_progress", [])),
                self._event("response.in_progress", response=self._response("in_progress", []))]

    def _add(self, item: dict) -> list:
        events = self._finish_item()
        self._items.append(item)
        return events + [self._event("response.output_item.added", output_index=len(self._items) - 1, item=item)]

    def _finish_item(self) -> list:
        """Events that close the open item (text done, arguments done, item done)."""
        if not self._items or self._items[-1]["status"] == "completed":
            return []
        item, index = self._items[-1], len(self._items) - 1
        item["status"] = "completed"
        if item["type"] == "message":
            part = item["content"][0]
            events = [self._event("response.output_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=part["text"], logprobs=[]),
                      self._event("response.content_part.done", item_id=item["id"], output_index=index,
                                  content_index=0, part=part)]
        elif item["type"] == "reasoning":
            events = [self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                  content_index=0, text=item["content"][0]["text"])]
        else:
            events = [self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                  arguments=item["arguments"])]
        return events + [self._event("response.output_item.done", output_index=index, item=item)]

    def stream_event(self, event) -> list:
        index = len(self._items) - 1
        if isinstance(event, CallDelta):
            events = []
            if event.id is not None:
                events = self._add(self._function_call(event.id, event.name, "", "in_progress"))
                index += 1
            self._items[index]["arguments"] += event.arguments
            if event.arguments:
                events.append(self._event("response.function_call_arguments.delta", item_id=self._items[index]["id"],
                                          output_index=index, delta=event.arguments))
            return events
        if isinstance(event, ReasoningDelta):
            events = []
            if not self._items or self._items[-1]["type"] != "reasoning" or self._items[-1]["status"] == "completed":
                events = self._add(_reasoning(new_id("rs"), "", "in_progress"))
                index = len(self._items) - 1
            self._items[index]["content"][0]["text"] += event.text
            return events + [self._event("response.reasoning_text.delta", item_id=self._items[index]["id"],
                                         output_index=index, content_index=0, delta=event.text)]
        events = []
        if not self._items or self._items[-1]["type"] != "message" or self._items[-1]["status"] == "completed":
            events = self._add(_message(new_id("msg"), "", "in_progress"))
            index = len(self._items) - 1
            events.append(self._event("response.content_part.added", item_id=self._items[index]["id"],
                                      output_index=index, content_index=0, part=_text_part("")))
        self._items[index]["content"][0]["text"] += event.text
        return events + [self._event("response.output_text.delta", item_id=self._items[index]["id"],
                                     output_index=index, content_index=0, delta=event.text, logprobs=[])]

    def stream_keepalive(self) -> list:
        return [self._event("response.in_progress", response=self._response("in_progress", self._items))]

    def stream_end(self, done) -> list:
        events = self._finish_item()
        final = self._response("completed", self._items, done)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        return events + [self._event(kind, response=final)]

    def stream_error(self, error: APIError) -> tuple:
        return self._event("error", code=error.code, message=error.message, param=None)


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message(item_id: str, text: str, status: str) -> dict:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [_text_part(text)]}


def _reasoning(item_id: str, text: str, status: str) -> dict:
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}
