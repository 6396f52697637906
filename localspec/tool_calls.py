"""Tool calls in the model's own syntax: which syntax a chat template uses, parsing it, constraining it.

Like llama.cpp's common/chat, one module knows the template families, for the server and the CLI alike:

- ``hermes``: Qwen2.5 / Qwen3 and many fine-tunes, ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``;
- ``qwen3-coder``: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>...``;
- ``llama3``: Llama 3.x answers a call as a bare ``{"name": ..., "parameters": {...}}`` (after an optional
  ``<|python_tag|>``);
- ``mistral``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, or in newer templates
  ``[TOOL_CALLS]NAME[ARGS]{...}`` per call;
- ``generic``: the template has no tool syntax of its own (it never reads ``tools``): the tools and the
  hermes syntax are described in a system message, and calls are parsed as hermes.

A ``ToolCallParser`` turns streamed text into content and tool-call deltas as OpenAI streams them: a call's
id and name once, then fragments of its arguments (a JSON object as text).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from localspec.errors import UsageError

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LLAMA3_PYTHON_TAG = "<|python_tag|>"
MISTRAL_OPEN, MISTRAL_ARGS = "[TOOL_CALLS]", "[ARGS]"
# A hermes call's head; the arguments start at the first non-blank after it (a lookahead, so a head seen
# before its arguments have begun to stream is not taken as complete).
_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')
# A hermes answer may open with a bare or fenced call object (llama.cpp's parser accepts the same);
# an answer starting with "{" or "`" is held back this many characters at most to tell.
_BARE_CALL = re.compile(r'(```[A-Za-z]*[ \t]*\n)?\s*\{\s*"name"\s*:')
_BARE_CALL_LOOKAHEAD = 32
_XML_NAME = r"[^>\s]+"
_XML_FUNCTION = re.compile(rf"<function=({_XML_NAME})>(.*?)</function>", re.S)
_XML_PARAMETER = re.compile(rf"<parameter=({_XML_NAME})>\n?(.*?)\n?</parameter>", re.S)
# A Qwen3-Coder value is read up to the first closing tag, so a forced value may hold none of them.
_XML_VALUE = r"/(?s:.*)/ & ~/(?s:.*)<\/(parameter|function|tool_call)>(?s:.*)/"
GENERIC_INSTRUCTIONS = (
    "You can call functions. Their signatures, as JSON, are:\n{tools}\n\n"
    "To call one, answer with a JSON object inside tags, one per call:\n"
    '<tool_call>\n{{"name": <function name>, "arguments": <arguments as a JSON object>}}\n</tool_call>'
)


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolSyntax:
    """One family's tool-call syntax.

    ``opener``: text that starts the calls (``at_start`` when it only counts at the start of the answer);
    ``closer``: text that ends one call, when calls are closed one by one.
    """

    family: str
    opener: str
    closer: str | None = None
    at_start: bool = False

    @property
    def generic(self) -> bool:
        return self.family == "generic"


HERMES = ToolSyntax("hermes", HERMES_OPEN, HERMES_CLOSE)
QWEN3_CODER = ToolSyntax("qwen3-coder", HERMES_OPEN, HERMES_CLOSE)
LLAMA3 = ToolSyntax("llama3", "{", at_start=True)
MISTRAL = ToolSyntax("mistral", MISTRAL_OPEN)
GENERIC = ToolSyntax("generic", HERMES_OPEN, HERMES_CLOSE)


def detect_syntax(template: str) -> ToolSyntax:
    """The tool-call syntax a chat template teaches its model (``GENERIC`` when it defines none)."""
    if "tools" not in template:
        return GENERIC
    if "<function=" in template and "<parameter=" in template:
        return QWEN3_CODER
    if HERMES_OPEN in template:
        return HERMES
    if MISTRAL_OPEN in template:
        return MISTRAL
    if "<|start_header_id|>" in template and "ipython" in template:
        return LLAMA3
    return GENERIC


def generic_tool_messages(messages: list[dict], tools: list[dict]) -> list[dict]:
    """A chat for a template without tool support: the tools and their syntax in the system message,
    earlier calls written out in that syntax, tool results as user turns."""
    out = []
    for message in messages:
        if message.get("tool_calls"):
            calls = "\n".join(hermes_call_text(c["function"]["name"], c["function"]["arguments"])
                              for c in message["tool_calls"])
            out.append({"role": "assistant", "content": "\n".join(filter(None, (message["content"], calls)))})
        elif message["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"})
        else:
            out.append(message)
    if tools:
        listing = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools)
        instructions = GENERIC_INSTRUCTIONS.format(tools=listing)
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{instructions}"}
        else:
            out.insert(0, {"role": "system", "content": instructions})
    return out


def hermes_call_text(name: str, arguments: dict) -> str:
    return f"{HERMES_OPEN}\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n{HERMES_CLOSE}"


# -- parsing ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class CallDelta:
    """A piece of tool call ``index``: the first carries ``id`` and ``name``, every one a fragment of arguments."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None


Delta = TextDelta | CallDelta


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # a JSON object, as text


def collect_calls(deltas: list[Delta]) -> tuple[str, list[ToolCall]]:
    """The content and the whole calls that a sequence of deltas spells."""
    text, calls = [], []
    for delta in deltas:
        if isinstance(delta, TextDelta):
            text.append(delta.text)
        elif delta.id is not None:
            calls.append(ToolCall(delta.id, delta.name, delta.arguments))
        else:
            calls[delta.index].arguments += delta.arguments
    return "".join(text), calls


class ToolCallParser:
    """Splits an answer, as it streams, into content and tool calls of one syntax.

    Text that could be the start of a call is held back until it is known not to be. A hermes call
    streams its arguments as they come (all but the wrapper's closing brace); other syntaxes give each
    call whole when it closes or the answer ends. A call naming none of ``tools`` (OpenAI function tools;
    None: any name) is not a call: its text, wrapper included, is the answer's text. Their schemas say
    which Qwen3-Coder values are bare strings.

    Like llama.cpp, a hermes answer that *starts* with a bare or fenced JSON object is a call too
    (Qwen2.5-Coder answers that way), but only an object of exactly ``name`` and ``arguments`` whose name
    is an offered tool and whose arguments fit its schema (``fits_schema``); it is read whole when it
    closes. Anything else, such as an object that also carries a tool's ``response``, is text.
    """

    def __init__(self, syntax: ToolSyntax, tools: list[dict] | None = None) -> None:
        self.syntax = syntax
        self.names = None if tools is None else {t["function"]["name"] for t in tools}
        self._bare = {t["function"]["name"]: _bare_strings(t["function"]) for t in tools or ()}
        self._schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in tools or ()}
        self.calls = 0
        self._untagged = False  # the open call is a bare or fenced object, read whole when it closes
        self._held = ""
        # "start" (a call may open the answer), "text", "prose" (text that cannot hold a call),
        # "call" (inside one) or "between" (after a call: only another call may follow)
        self._mode = "start" if syntax.at_start or syntax.family in ("hermes", "generic") else "text"
        self._entry = ""  # the text that opened the current call, given back if it is not a call
        self._closer = syntax.closer  # what ends the current call (None: the end of the answer)
        self._named = False  # the open hermes call's id and name have been sent
        self._args_at = 0  # where its arguments begin in the held text
        self._sent = 0  # characters of its arguments already sent

    def feed(self, text: str) -> list[Delta]:
        self._held += text
        out: list[Delta] = []
        self._advance(out, final=False)
        return out

    def finish(self) -> list[Delta]:
        """Deltas for whatever was held back, at the end of the answer."""
        out: list[Delta] = []
        self._advance(out, final=True)
        if self._held.strip():
            out.append(TextDelta(self._held))
        self._held = ""
        return out

    def _enter_call(self, entry_length: int, closer: str | None) -> None:
        self._entry, self._held = self._held[:entry_length], self._held[entry_length:]
        self._mode, self._closer = "call", closer

    def _advance(self, out: list[Delta], *, final: bool) -> None:
        while True:
            if self._mode == "start":
                if not self._start(final):
                    return
            elif self._mode == "prose":
                if self._held:
                    out.append(TextDelta(self._held))
                    self._held = ""
                return
            elif self._mode in ("text", "between"):
                opener = self.syntax.opener
                at = self._held.find(opener)
                if at < 0:
                    keep = 0 if final else partial_suffix(self._held, opener)
                    if self._mode == "text" and len(self._held) > keep:
                        out.append(TextDelta(self._held[: len(self._held) - keep]))
                        self._held = self._held[len(self._held) - keep:]
                    return
                if at and self._mode == "text":
                    out.append(TextDelta(self._held[:at]))
                    self._held = self._held[at:]
                    at = 0
                self._enter_call(at + len(opener), self.syntax.closer)
            else:
                closer = self._closer
                end = self._held.find(closer) if closer else -1
                block = self._held if end < 0 else self._held[:end]
                closed = end >= 0 or final
                if self._untagged:
                    if not closed:
                        return
                    if not self._untagged_call(out, block):
                        self._reject()
                elif self.syntax.family in ("hermes", "generic"):
                    self._stream_hermes(out, block, closed=closed)
                elif closed:
                    self._emit_whole(out, block)
                if self._mode == "prose":
                    continue  # not a call of an offered tool: its text goes out as prose
                if not closed:
                    return
                self._held = "" if end < 0 else self._held[end + len(closer):]
                self._mode = "between"
                if end < 0:
                    return

    def _start(self, final: bool) -> bool:
        """Decide whether the answer opens with a call; False while more text is needed to tell."""
        stripped = self._held.lstrip()
        blanks = len(self._held) - len(stripped)
        if self.syntax.family == "llama3":
            if stripped.startswith(LLAMA3_PYTHON_TAG):
                blanks += len(LLAMA3_PYTHON_TAG)
                stripped = stripped[len(LLAMA3_PYTHON_TAG):]
            if not final and (not stripped.strip() or LLAMA3_PYTHON_TAG.startswith(stripped)):
                return False  # nothing but blanks or part of the tag yet
            body = stripped.lstrip()
            if body.startswith(self.syntax.opener):
                self._enter_call(len(self._held) - len(body), None)
            else:
                self._mode = "prose"  # an answer that does not start with a call is prose to its end
            return True
        match = _BARE_CALL.match(stripped)
        if match:
            fence = match.group(1)
            self._enter_call(blanks + stripped.index("{", len(fence or "")), "```" if fence else None)
            self._untagged = True
        elif not final and stripped[:1] in ("", "`", "{") and len(stripped) < _BARE_CALL_LOOKAHEAD:
            return False
        else:
            self._mode = "text"
        return True

    def _reject(self) -> None:
        """The open call names no offered tool: it was text, and so is the rest of the answer."""
        self._held = self._entry + self._held
        self._mode = "prose"

    def _untagged_call(self, out: list[Delta], block: str) -> bool:
        """Emit a bare or fenced call whole; False when ``block`` is not one (see the class docstring)."""
        try:
            value = json.loads(block)
        except ValueError:
            return False
        if not isinstance(value, dict) or set(value) != {"name", "arguments"}:
            return False
        name, arguments = value["name"], value["arguments"]
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return False
        if self.names is not None and (name not in self.names or not fits_schema(arguments, self._schemas[name])):
            return False
        out.append(CallDelta(self.calls, json.dumps(arguments, ensure_ascii=False), id=new_call_id(), name=name))
        self.calls += 1
        self._untagged = False
        return True

    def _stream_hermes(self, out: list[Delta], block: str, *, closed: bool) -> None:
        if not self._named:
            match = _NAME.match(block)
            if match is None:
                if closed:
                    self._emit_whole(out, block)  # another shape of JSON ("parameters"...) or not a call
                return
            name = json.loads(f'"{match.group(1)}"')
            if self.names is not None and name not in self.names:
                self._reject()
                return
            out.append(CallDelta(self.calls, "", id=new_call_id(), name=name))
            self._named, self._args_at, self._sent = True, match.end(), 0
        arguments = block[self._args_at:]
        if closed:
            ready = arguments.rstrip()
            ready = ready[:-1].rstrip() if ready.endswith("}") else ready
        else:
            # The wrapper's closing brace could be the last one so far: hold it (and what follows) back.
            brace = arguments.rfind("}")
            ready = arguments if brace < 0 else arguments[:brace]
        if len(ready) > self._sent:
            out.append(CallDelta(self.calls, ready[self._sent:]))
            self._sent = len(ready)
        if closed:
            self.calls += 1
            self._named = False

    def _emit_whole(self, out: list[Delta], block: str) -> None:
        calls = _whole_calls(self.syntax, block, self._bare)
        if not calls or (self.names is not None and any(name not in self.names for name, _ in calls)):
            self._reject()  # not a call after all: the answer's text, wrapper included
            return
        for name, arguments in calls:
            out.append(CallDelta(self.calls, arguments, id=new_call_id(), name=name))
            self.calls += 1


def _whole_calls(syntax: ToolSyntax, block: str, bare: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(name, arguments as JSON text) of each call written in ``block``; [] when it is not a call.

    ``bare``: per function, the Qwen3-Coder parameters whose values are strings written as they are.
    """
    if syntax.family == "qwen3-coder":
        return [(name, json.dumps({p: v if p in bare.get(name, ()) else _xml_value(v)
                                   for p, v in _XML_PARAMETER.findall(body)}, ensure_ascii=False))
                for name, body in _XML_FUNCTION.findall(block)]
    if syntax.family == "mistral" and MISTRAL_ARGS in block:
        # Newer Mistral templates (Devstral, Small 3.2): NAME[ARGS]{...}, each call after its own [TOOL_CALLS].
        calls = []
        for part in block.split(MISTRAL_OPEN):
            name, _, arguments = part.partition(MISTRAL_ARGS)
            calls.append({"name": name.strip(), "arguments": arguments})
    else:
        try:
            value = json.loads(block)
        except ValueError:
            return []
        calls = value if isinstance(value, list) else [value]
    result = []
    for call in calls:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            return []
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):  # some fine-tunes write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return []
        if not isinstance(arguments, dict):
            return []
        result.append((call["name"], json.dumps(arguments, ensure_ascii=False)))
    return result


_JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
               "object": dict, "null": type(None)}


def fits_schema(value: object, schema: dict) -> bool:
    """Whether ``value`` fits the parts of a JSON schema that tell a call from other JSON: the types, the
    required and (with ``additionalProperties: false``) the only properties, enums; nested alike."""
    if not isinstance(schema, dict):
        return True
    types = schema.get("type")
    if types is not None:
        types = [types] if isinstance(types, str) else types
        expected = tuple(t for name in types for t in _flat(_JSON_TYPES.get(name, object)))
        # true is an int in Python, but not a JSON number; 1.0 is a JSON integer.
        if isinstance(value, bool) and bool not in expected:
            return False
        if not isinstance(value, expected) and not ("integer" in types and isinstance(value, float)
                                                    and value.is_integer()):
            return False
    values = _listed(schema)
    if values is not None and value not in values:
        return False
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        if any(key not in value for key in schema.get("required") or ()):
            return False
        if schema.get("additionalProperties") is False and any(key not in properties for key in value):
            return False
        return all(fits_schema(item, properties[key]) for key, item in value.items() if key in properties)
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return all(fits_schema(item, schema["items"]) for item in value)
    return True


def _flat(kind) -> tuple:
    return kind if isinstance(kind, tuple) else (kind,)


def _xml_value(text: str):
    # Qwen3-Coder writes strings bare and other values as JSON.
    try:
        return json.loads(text)
    except ValueError:
        return text


def _listed(schema: dict) -> list | None:
    """The values ``schema`` allows by listing them (its enum or const), or None."""
    return schema.get("enum", [schema["const"]] if "const" in schema else None)


def _bare_string(schema: dict) -> bool:
    """Whether Qwen3-Coder writes a value of ``schema`` bare (a string) rather than as JSON."""
    values = _listed(schema)
    return schema.get("type") == "string" if values is None else all(isinstance(v, str) for v in values)


def _bare_strings(function: dict) -> set[str]:
    properties = (function.get("parameters") or {}).get("properties") or {}
    return {name for name, schema in properties.items() if isinstance(schema, dict) and _bare_string(schema)}


def partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


# -- grammars ---------------------------------------------------------------------------------------------
def call_grammar(syntax: ToolSyntax, tools: list[dict], *, parallel: bool, special: dict[str, str],
                 json_text=json.dumps) -> str:
    """A Lark grammar (llguidance's dialect) whose every sentence is one call (or several when ``parallel``)
    of one of ``tools``, in ``syntax``, with arguments valid against the tool's JSON schema.

    ``special`` maps marker texts that are single special tokens to llguidance's ``<[id]>`` form, so the
    model writes its wrapper tokens the way it was trained to; ``json_text`` writes a schema for ``%json``.

    Raises:
        UsageError: a Qwen3-Coder parameter name that its syntax cannot carry.
    """
    def literal(text: str) -> str:
        return special.get(text) or json.dumps(text)

    rules, alternatives = [], []
    for i, tool in enumerate(tools):
        function = tool["function"]
        alternatives.append(f"call_{i}")
        if syntax.family == "qwen3-coder":
            rules += _xml_call_rules(f"call_{i}", function, literal, json_text)
            continue
        name = json.dumps(function["name"])[1:-1]
        if syntax.family == "llama3":
            head = json.dumps('{"name": "' + name + '", "parameters": ')
            rules.append(f"call_{i}: {head} args_{i} \"}}\"")
        elif syntax.family == "mistral":
            head = json.dumps('{"name": "' + name + '", "arguments": ')
            rules.append(f"call_{i}: {head} args_{i} \"}}\"")
        else:
            head = json.dumps('\n{"name": "' + name + '", "arguments": ')
            rules.append(f"call_{i}: {literal(HERMES_OPEN)} {head} args_{i} \"}}\\n\" {literal(HERMES_CLOSE)}")
        rules.append(f"args_{i}: %json {json_text(function.get('parameters') or {'type': 'object'})}")
    rules.append("call: " + " | ".join(alternatives))
    if syntax.family == "mistral":
        body = 'call ("," call)*' if parallel else "call"
        start = f'start: {literal(MISTRAL_OPEN)} "[" {body} "]"'
    elif syntax.family == "llama3":
        start = "start: call"  # Llama 3 writes one call per answer
    elif syntax.family == "qwen3-coder":
        # Its template writes calls back to back; a newline between them reads the same.
        start = 'start: call ("\\n"? call)*' if parallel else "start: call"
        rules.append(f'XML_TEXT: ({_XML_VALUE}) "\\n</parameter>\\n"')
    else:
        start = 'start: call ("\\n" call)*' if parallel else "start: call"
    return "\n".join([start, *rules])


def _xml_call_rules(rule: str, function: dict, literal, json_text) -> list[str]:
    """Qwen3-Coder's call of ``function``: its parameters in the schema's order (the required ones always),
    each value bare text (a string; one of its enum if it has one) or JSON valid against its schema."""
    parameters = function.get("parameters") or {}
    required = set(parameters.get("required") or ())
    close = json.dumps("\n</parameter>\n")
    parts, rules = [], []
    for j, (key, schema) in enumerate((parameters.get("properties") or {}).items()):
        if not re.fullmatch(_XML_NAME, key):
            raise UsageError(f"the parameter {key!r} of {function['name']} cannot be written in Qwen3-Coder's "
                             "tool syntax (its name has a space or '>'); rename it or send tool_choice 'auto'")
        schema = schema if isinstance(schema, dict) else {}
        values = _listed(schema)
        if not _bare_string(schema):
            value = f"%json {json_text(schema)} {close}"
        elif values:
            value = f'({" | ".join(json.dumps(v) for v in values)}) {close}'
        else:
            value = "XML_TEXT"
        opener = json.dumps(f"<parameter={key}>\n")
        rules.append(f"{rule}_{j}: {opener} {value}")
        parts.append(f"{rule}_{j}" if key in required else f"{rule}_{j}?")
    head = json.dumps(f"\n<function={function['name']}>\n")
    tail = json.dumps("</function>\n")
    body = " ".join([head, *parts, tail])
    return [f"{rule}: {literal(HERMES_OPEN)} {body} {literal(HERMES_CLOSE)}", *rules]
