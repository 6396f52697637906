"""Tool-call syntaxes: detection from templates, parsing streamed answers, the grammars of forced calls."""

from __future__ import annotations

import json

import pytest

from localspec.engine.decoding.constraints import GrammarConstraint, compact_json
from localspec.engine.llama.model import Model
from localspec.errors import UsageError
from localspec.tool_calls import (
    GENERIC,
    HERMES,
    LLAMA3,
    MISTRAL,
    QWEN3_CODER,
    CallDelta,
    TextDelta,
    ToolCallParser,
    call_grammar,
    collect_calls,
    detect_syntax,
    fits_schema,
    generic_tool_messages,
)
from tests.tiny_models import CHAT_TEMPLATE, QWEN_TOOLS_TEMPLATE

TOOL = {"type": "function", "function": {"name": "read_file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


def parse(syntax, text: str, chunk: int, tools=None) -> tuple[str, list]:
    """Feed ``text`` in pieces of ``chunk`` characters, as a stream would."""
    parser = ToolCallParser(syntax, tools)
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
    assert parse(syntax, answer, chunk, tools=[TOOL]) == (answer, [])


# After a tool result Qwen2.5-Coder 1.5B often "answers" with the call and its result in one object.
NOT_CALLS = [
    '{"name": "read_file", "arguments": {"path": "a.py"}, "response": "print(1)"}',
    '```json\n{"name": "read_file", "arguments": {"path": "a.py"}, "response": "print(1)"}\n```\nDone.',
    '{{"name": "read_file", "arguments": {"path": "a.py"}}}',
    '<tool_call>\n{{"name": "read_file", "arguments": {"path": "a.py"}, "response": "print(1)"}}\n</tool_call>',
    '{"name": "read_file", "arguments": {"file": "a.py"}}',  # the required "path" is missing
    '{"name": "read_file", "arguments": {"path": 3}}',  # a number where the schema has a string
    '{"name": "read_file", "arguments": "a.py"}',
]


@pytest.mark.parametrize("answer", NOT_CALLS)
@pytest.mark.parametrize("chunk", [1, 7, 1000])
def test_an_object_that_is_no_call_of_an_offered_tool_is_text(answer, chunk):
    assert parse(HERMES, answer, chunk, tools=[TOOL]) == (answer, [])


def test_an_untagged_call_is_read_whole_and_its_text_after_it_is_kept():
    answer = '```json\n{"name": "read_file", "arguments": {"path": "a.py"}}\n```\nThis reads the file.'
    text, [call] = parse(HERMES, answer, 5, tools=[TOOL])
    assert (call.name, json.loads(call.arguments), text) == ("read_file", {"path": "a.py"}, "\nThis reads the file.")


@pytest.mark.parametrize("value,schema,fits", [
    ({"path": "a"}, TOOL["function"]["parameters"], True),
    ({}, TOOL["function"]["parameters"], False),
    ({"path": "a", "extra": 1}, {**TOOL["function"]["parameters"], "additionalProperties": False}, False),
    ({"path": "a", "extra": 1}, TOOL["function"]["parameters"], True),
    ({"n": 2.0}, {"type": "object", "properties": {"n": {"type": "integer"}}}, True),
    ({"n": True}, {"type": "object", "properties": {"n": {"type": "integer"}}}, False),
    ({"n": None}, {"type": "object", "properties": {"n": {"type": ["string", "null"]}}}, True),
    ({"mode": "w"}, {"type": "object", "properties": {"mode": {"enum": ["r", "a"]}}}, False),
    ({"lines": [1, "2"]}, {"type": "object", "properties": {"lines": {"type": "array", "items": {"type": "integer"}}}},
     False),
    ({"opts": {"deep": 1}}, {"type": "object", "properties": {"opts": {"type": "object", "required": ["x"]}}}, False),
])
def test_arguments_fit_a_schema_by_type_required_keys_and_enums(value, schema, fits):
    assert fits_schema(value, schema) is fits


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


# -- Qwen3-Coder's forced calls: what the grammar allows, the parser reads back ------------------------------
EDIT = {"type": "function", "function": {"name": "edit", "parameters": {
    "type": "object", "required": ["path", "text"], "properties": {
        "path": {"type": "string", "enum": ["a.py", "b.py"]}, "text": {"type": "string"},
        "line": {"type": "integer"}, "options": {"type": "object", "properties": {"dry": {"type": "boolean"}}}}}}}
NOOP = {"type": "function", "function": {"name": "noop", "parameters": {"type": "object", "properties": {}}}}


def coder_call(name: str, arguments: dict) -> str:
    """A call as Qwen3-Coder's template writes it: strings bare, other values as JSON."""
    parameters = "".join(f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
                         for key, value in arguments.items())
    return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"


@pytest.fixture(scope="module")
def vocabulary(make_tiny_model):
    """A tiny model's tokenizer, without SentencePiece's leading space, so a text tokenizes as written."""
    path = make_tiny_model("plain-vocab", extra={"tokenizer.ggml.add_space_prefix": False})
    return Model(path, vocab_only=True)


def follows(model, grammar: str, text: str) -> bool:
    """Whether ``text`` is a whole sentence of ``grammar`` (each token allowed, then the end of generation)."""
    constraint = GrammarConstraint(model, grammar)
    for token in model.tokenize(text, add_bos=False, special=False):
        if not constraint.allowed()[token]:
            return False
        constraint.advance([token])
    return bool(constraint.allowed()[model.eos_id])


CODER_CALLS = [
    [("edit", {"path": "a.py", "text": "x = 1"})],
    [("edit", {"path": "b.py", "text": "\ndef f():\n    return '</param' + \"true\"\n\n", "line": 3,
               "options": {"dry": True}})],
    [("edit", {"path": "a.py", "text": "10"})],  # a string that reads as JSON stays a string
    [("edit", {"path": "a.py", "text": ""})],
    [("noop", {})],
    [("noop", {}), ("edit", {"path": "a.py", "text": "y"})],
]


@pytest.mark.parametrize("calls", CODER_CALLS)
def test_a_forced_qwen3_coder_call_is_read_back_as_written(vocabulary, calls):
    grammar = call_grammar(QWEN3_CODER, [EDIT, NOOP], parallel=True, special={}, json_text=compact_json)
    text = "".join(coder_call(name, arguments) for name, arguments in calls)
    assert follows(vocabulary, grammar, text)
    for chunk in (1, 1000):
        content, parsed = parse(QWEN3_CODER, text, chunk, tools=[EDIT, NOOP])
        assert content == "" and [(c.name, json.loads(c.arguments)) for c in parsed] == calls


@pytest.mark.parametrize("text", [
    coder_call("delete", {}),  # not an offered function
    coder_call("edit", {"path": "a.py", "text": "x", "mode": "w"}),  # not one of its parameters
    coder_call("edit", {"path": "c.py", "text": "x"}),  # not in the enum
    coder_call("edit", {"path": "a.py"}),  # a required parameter missing
    coder_call("edit", {"path": "a.py", "text": "x", "line": "three"}),  # not an integer
    coder_call("edit", {"path": "a.py", "text": "a </parameter> b"}),  # would end the value early
    coder_call("edit", {"text": "x", "path": "a.py"}),  # parameters come in the schema's order
])
def test_the_qwen3_coder_grammar_refuses_other_calls(vocabulary, text):
    grammar = call_grammar(QWEN3_CODER, [EDIT, NOOP], parallel=False, special={}, json_text=compact_json)
    assert not follows(vocabulary, grammar, text)
    assert follows(vocabulary, grammar, coder_call("noop", {}))


def test_a_forced_qwen3_coder_call_uses_the_special_tokens_and_only_the_chosen_tool():
    grammar = call_grammar(QWEN3_CODER, [NOOP], parallel=False, special={"<tool_call>": "<[7]>"})
    assert grammar.startswith("start: call\n") and "<[7]>" in grammar and "edit" not in grammar
    spaced = {"type": "function", "function": {"name": "f", "parameters": {"properties": {"a b": {}}}}}
    with pytest.raises(UsageError, match="'a b'"):
        call_grammar(QWEN3_CODER, [spaced], parallel=False, special={})
