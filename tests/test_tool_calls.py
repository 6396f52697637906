"""Tool-call syntaxes: detection from templates, parsing streamed answers, the grammars of forced calls."""

from __future__ import annotations

import json

import pytest

from localspec.errors import UsageError
from localspec.tool_calls import (
    GENERIC, HERMES, LLAMA3, MISTRAL, QWEN3_CODER, CallDelta, TextDelta, ToolCallParser, call_grammar,
    collect_calls, detect_syntax, generic_tool_messages,
)
from tests.tiny_models import CHAT_TEMPLATE, QWEN_TOOLS_TEMPLATE

TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


def parse(syntax, text: str, chunk: int, names=None) -> tuple[str, list]:
    """Feed ``text`` in pieces of ``chunk`` characters, as a stream would."""
    parser = ToolCallParser(syntax, names)
    deltas = []
    for i in range(0, len(text), chunk):
        deltas += parser.feed(text[i:i + chunk])
    deltas += parser.finish()
    return collect_calls(deltas)


CASES = [
    # (syntax, answer, expected content, expected [(name, arguments)])
    (HERMES, 'Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>',
     "Let me look.\n", [("read_file", {"path": "a.py"})]),
    (HERMES, '<tool_call>\n{"name": "a", "arguments": {"x": {"y": [1, "}"]}}}\n</tool_call>\n'
             '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
     "", [("a", {"x": {"y": [1, "}"]}}), ("b", {})]),
    (HERMES, "Just text, with a < sign and <tool but no call.", "Just text, with a < sign and <tool but no call.", []),
    (QWEN3_CODER, "<tool_call>\n<function=read_file>\n<parameter=path>\na.py\n</parameter>\n"
                  "<parameter=lines>\n10\n</parameter>\n</function>\n</tool_call>",
     "", [("read_file", {"path": "a.py", "lines": 10})]),
    (LLAMA3, '<|python_tag|>{"name": "read_file", "parameters": {"path": "a.py"}}', "",
     [("read_file", {"path": "a.py"})]),
    (LLAMA3, "{curly} prose is not a call", "{curly} prose is not a call", []),
    (LLAMA3, "The answer is {x}.", "The answer is {x}.", []),
    (MISTRAL, '[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "a.py"}}]', "",
     [("read_file", {"path": "a.py"})]),
    (MISTRAL, 'Reading.[TOOL_CALLS]read_file[ARGS]{"path": "a.py"}[TOOL_CALLS]read_file[ARGS]{"path": "b.py"}',
     "Reading.", [("read_file", {"path": "a.py"}), ("read_file", {"path": "b.py"})]),
    # Qwen2.5-Coder's own habit: the call as a fenced (or bare) JSON object opening the answer.
    (HERMES, '```json\n{\n  "name": "read_file",\n  "arguments": {\n    "path": "a.py"\n  }\n}\n```', "",
     [("read_file", {"path": "a.py"})]),
    (HERMES, '{"name": "read_file", "arguments": {"path": "a.py"}}', "", [("read_file", {"path": "a.py"})]),
    (HERMES, "```python\nprint({'name': 1})\n```", "```python\nprint({'name': 1})\n```", []),
    (HERMES, '{"a": 1} is a dict', '{"a": 1} is a dict', []),
]


@pytest.mark.parametrize("chunk", [1, 3, 1000])
@pytest.mark.parametrize("syntax,answer,content,calls", CASES)
def test_answers_parse_into_content_and_calls_however_they_are_streamed(syntax, answer, content, calls, chunk):
    text, parsed = parse(syntax, answer, chunk)
    assert text == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls
    assert len({c.id for c in parsed}) == len(parsed)


@pytest.mark.parametrize("syntax,answer", [
    (HERMES, '```json\n{"name": "rm_rf", "arguments": {}}\n```'),
    (HERMES, 'Sure.\n<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>'),
    (MISTRAL, '[TOOL_CALLS][{"name": "rm_rf", "arguments": {}}]'),
    (LLAMA3, '{"name": "rm_rf", "parameters": {}}'),
])
@pytest.mark.parametrize("chunk", [1, 1000])
def test_a_call_of_a_tool_not_offered_is_text(syntax, answer, chunk):
    assert parse(syntax, answer, chunk, names={"read_file"}) == (answer, [])


def test_an_answer_opening_with_a_brace_or_fence_is_held_back_only_briefly():
    parser = ToolCallParser(HERMES)
    assert parser.feed("```") == []
    assert collect_calls(parser.feed("python\n" + "x = 1\n" * 8))[0].startswith("```python\nx = 1")


def test_hermes_arguments_stream_before_the_call_closes():
    parser = ToolCallParser(HERMES)
    deltas = parser.feed('<tool_call>\n{"name": "write", "arguments": {"text": "a long file')
    assert deltas[0] == CallDelta(0, "", id=deltas[0].id, name="write")
    assert deltas[1:] == [CallDelta(0, '{"text": "a long file')]
    assert parser.feed('"}}\n</tool_call>') == [CallDelta(0, '"}')]


def test_text_before_a_possible_opener_is_held_back_only_as_long_as_it_could_be_one():
    parser = ToolCallParser(HERMES)
    assert parser.feed("abc <tool") == [TextDelta("abc ")]
    assert parser.feed("s>") == [TextDelta("<tools>")]


@pytest.mark.parametrize("template,syntax", [
    (QWEN_TOOLS_TEMPLATE, HERMES),
    (CHAT_TEMPLATE, GENERIC),
    ("{% if tools %}<function=x><parameter=y>{% endif %}", QWEN3_CODER),
    ("{% if tools %}[TOOL_CALLS]{% endif %}", MISTRAL),
    ("{% if tools %}<|start_header_id|>ipython{% endif %}", LLAMA3),
    ("{% if tools %}{{ tools }}{% endif %}", GENERIC),
])
def test_the_syntax_is_detected_from_the_template(template, syntax):
    assert detect_syntax(template) == syntax


def test_a_template_without_tools_gets_them_in_the_system_message_and_history_as_text():
    call = {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": {"path": "a.py"}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "print(1)"}]
    out = generic_tool_messages(messages, [TOOL])
    assert out[0]["content"].startswith("Be brief.\n\n") and '"name": "read_file"' in out[0]["content"]
    assert out[2] == {"role": "assistant", "content":
                      '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'}
    assert out[3] == {"role": "user", "content": "<tool_response>\nprint(1)\n</tool_response>"}
    assert text_of(ToolCallParser(GENERIC), out[2]["content"])[1][0].name == "read_file"


def text_of(parser, text):
    return collect_calls(parser.feed(text) + parser.finish())


def test_forced_call_grammars_use_special_tokens_and_each_tool_schema():
    grammar = call_grammar(HERMES, [TOOL], parallel=False, special={"<tool_call>": "<[7]>"})
    assert grammar.startswith("start: call\n") and "<[7]>" in grammar and '"</tool_call>"' in grammar
    assert '%json {"type": "object", "properties": {"path"' in grammar
    assert 'start: call ("\\n" call)*' in call_grammar(HERMES, [TOOL], parallel=True, special={})
    with pytest.raises(UsageError, match="tool_choice 'auto'"):
        call_grammar(QWEN3_CODER, [TOOL], parallel=False, special={})
