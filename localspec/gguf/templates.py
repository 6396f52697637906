"""Chat templates from GGUF files, rendered only inside jinja2's immutable sandbox, with bounds.

A GGUF's ``tokenizer.chat_template`` is untrusted code: llama-cpp-python once rendered it in a plain
jinja2 Environment and a crafted template ran arbitrary Python (CVE-2024-34359). Here every render is
sandboxed like transformers does it (same helper functions, so prompts match), has a wall-clock
deadline and an output cap, and any failure becomes one ``TemplateError``.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from datetime import datetime
from types import FrameType

import jinja2
from jinja2 import nodes
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.errors import TemplateError

DEFAULT_TIMEOUT_S = 2.0
MAX_OUTPUT_CHARS = 8 * 1024 * 1024
# jinja2 compiles from_string templates under this file name; only those frames are traced.
_TEMPLATE_FILENAME = "<template>"
# Checking the clock on every traced line would slow rendering; every few hundred lines is enough.
_CLOCK_EVERY = 256
# Names that only exploit payloads use: jinja2's built-in globals whose functions lead to __globals__,
# and the template's own reference object.
_SUSPICIOUS_NAMES = frozenset({"self", "lipsum", "cycler", "joiner", "config", "request"})
_SUSPICIOUS_ATTRS = frozenset(
    {"mro", "globals", "builtins", "import", "popen", "system", "eval", "exec", "subprocess",
     "f_globals", "f_back", "gi_frame", "cr_frame", "tb_frame", "func_globals", "os"}
)
_DUNDER = re.compile(r"__\w+__")


class _RenderTimeout(Exception):
    pass


class _BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, plus size checks on ``*`` and ``**`` (one C call could allocate gigabytes)."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "**" and isinstance(right, int) and abs(right) > 64:
            raise TemplateError(f"template computes a power with exponent {right}")
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int) and len(seq) * times > MAX_OUTPUT_CHARS:
                    raise TemplateError("template builds a sequence larger than the output limit")
        return super().call_binop(context, operator, left, right)


def _raise_exception(message: object) -> None:
    raise TemplateError(f"chat template refused the conversation: {message}")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    # transformers' tojson (jinja2's own HTML-escapes <, > and &, which would change the prompt).
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=1)
def _environment() -> _BoundedSandbox:
    env = _BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not parse (line {exc.lineno}): {exc.message}") from None


def render_chat(
    template: str,
    messages: list[dict],
    *,
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    bos_token: str = "",
    eos_token: str = "",
    timeout: float = DEFAULT_TIMEOUT_S,
    max_chars: int = MAX_OUTPUT_CHARS,
    **extra,
) -> str:
    """Render ``messages`` with a chat template in the sandbox.

    Args:
        timeout: wall-clock seconds the render may take; ``max_chars``: largest output accepted.
        extra: further template variables (e.g. ``enable_thinking``).
    Raises:
        TemplateError: the template does not parse, raises, escapes the sandbox, loops too long or
            produces too much output.
    """
    compiled = _compile(template)
    context = dict(
        extra, messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
        bos_token=bos_token, eos_token=eos_token,
    )
    try:
        with _deadline(timeout):
            return _collect(compiled.generate(context), max_chars)
    except _RenderTimeout:
        raise TemplateError(f"chat template did not finish within {timeout:g} s") from None
    except TemplateError:
        raise
    except RecursionError:
        raise TemplateError("chat template recursed too deeply") from None
    except Exception as exc:  # untrusted code: any failure is the template's, reported in one line
        raise TemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None


# A probe's text, unlikely to be written by any template itself.
_PROBE = "localspec-probe-7f3a"


@functools.lru_cache(maxsize=16)
def shows_late_system(template: str) -> bool:
    """Whether ``template`` shows a system message that comes after the first turn (many only read the first)."""
    messages = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
                {"role": "system", "content": _PROBE}, {"role": "user", "content": "v"}]
    try:
        return _PROBE in render_chat(template, messages)
    except TemplateError:
        return False


def has_thinking_switch(template: str) -> bool:
    """Whether ``template`` reads Qwen3's ``enable_thinking`` switch."""
    return "enable_thinking" in template


def _collect(chunks, max_chars: int) -> str:
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > max_chars:
            raise TemplateError(f"chat template output exceeds {max_chars} characters")
        parts.append(chunk)
    return "".join(parts)


class _deadline:
    """Traces the template's own frames (not jinja2's or ours) and stops the render after ``seconds``.

    A thread cannot be killed and signals only reach the main thread, so a line tracer is the portable
    way to stop a template such as nested loops over a 100000-item list.
    """

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        self._steps = 0

    def __enter__(self) -> None:
        self._end = time.monotonic() + self._seconds
        self._previous = sys.gettrace()
        sys.settrace(self._on_call)

    def __exit__(self, *exc) -> None:
        sys.settrace(self._previous)

    def _on_call(self, frame: FrameType, event: str, arg):
        return self._on_line if frame.f_code.co_filename == _TEMPLATE_FILENAME else None

    def _on_line(self, frame: FrameType, event: str, arg):
        self._steps += 1
        if self._steps % _CLOCK_EVERY == 0 and time.monotonic() > self._end:
            raise _RenderTimeout
        return self._on_line


def template_security_findings(template: str) -> list[str]:
    """Constructs in ``template`` that no chat template needs and sandbox-escape payloads use.

    This is a static scan (nothing is rendered); the sandbox stays the real defence.
    Raises:
        TemplateError: the template does not parse.
    """
    try:
        tree = _environment().parse(template)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"chat template does not parse (line {exc.lineno}): {exc.message}") from None
    findings = []
    for node in tree.find_all((nodes.Getattr, nodes.Getitem, nodes.Name, nodes.Const, nodes.Filter)):
        problem = _node_problem(node)
        if problem:
            findings.append(f"line {node.lineno}: {problem}")
    for node in tree.find_all((nodes.Import, nodes.FromImport, nodes.Include, nodes.Extends)):
        findings.append(f"line {node.lineno}: loads another template ({type(node).__name__.lower()})")
    return list(dict.fromkeys(findings))


def _node_problem(node: nodes.Node) -> str | None:
    if isinstance(node, nodes.Getattr) and (node.attr.startswith("_") or node.attr in _SUSPICIOUS_ATTRS):
        return f"reaches for attribute {node.attr!r}"
    if isinstance(node, nodes.Name) and node.name in _SUSPICIOUS_NAMES:
        return f"uses {node.name!r}, a way out of the sandbox in known exploits"
    if isinstance(node, nodes.Const) and isinstance(node.value, str) and _DUNDER.search(node.value):
        return f"names the dunder {_DUNDER.search(node.value).group()!r} in a string"
    if isinstance(node, nodes.Filter) and node.name == "attr":
        return "looks attributes up by name with the 'attr' filter"
    return None
