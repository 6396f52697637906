"""/v1/responses end to end: a real server driven by the official openai client's Responses API (Codex CLI's)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.test_server import (  # noqa: F401 (tiny_server and tools_server are fixtures)
    QUESTION,
    READ_TOOL,
    SYSTEM,
    TIMEOUT_S,
    ask,
    client,
    tiny_server,
    tools_server,
)

TOOLS = [{"type": "function", **READ_TOOL["function"]}]
FORCE_READ = {"type": "function", "name": "read_file"}


def respond(server, **options):
    options = {"max_output_tokens": 40, "temperature": 0, "instructions": SYSTEM, "input": QUESTION, **options}
    return client(server).responses.create(model="tiny", **options)


def test_text_whole_and_streamed_equal_the_chat_completion(tiny_server):
    whole = respond(tiny_server)
    events = list(respond(tiny_server, stream=True))
    expected = ask(tiny_server).choices[0].message.content
    assert whole.output_text == events[-1].response.output_text == expected
    assert whole.object == "response" and whole.id.startswith("resp") and whole.usage.output_tokens > 0
    assert whole.model_extra["timings"]["method"] == "auto"
    kinds = [e.type for e in events]
    # The prefill's keepalives are more response.in_progress events, before the first item.
    first_item = kinds.index("response.output_item.added")
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert set(kinds[2:first_item]) <= {"response.in_progress"}
    kinds = kinds[:1] + kinds[first_item - 1:]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == expected


def test_max_output_tokens_leaves_the_response_incomplete(tiny_server):
    short = respond(tiny_server, max_output_tokens=3)
    assert short.status == "incomplete" and short.incomplete_details.reason == "max_output_tokens"
    assert short.usage.output_tokens == 3


def test_a_three_step_tool_loop_with_streamed_arguments(tools_server):
    items = [{"role": "user", "content": "fix a.py"}]
    first = respond(tools_server, input=items, tools=TOOLS, tool_choice=FORCE_READ, max_output_tokens=120)
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "read_file" and json.loads(call.arguments)["path"] in ("a.py", "b.py")
    items += [call.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": call.call_id,
                                                   "output": "print(1)"}]

    # The SDK's stream helper (which insists on OpenAI's event order) assembles the call.
    with client(tools_server).responses.stream(model="tiny", input=items, tools=TOOLS, tool_choice=FORCE_READ,
                                               max_output_tokens=120, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    [again] = [o for o in final.output if o.type == "function_call"]
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert again.arguments == deltas == call.arguments
    items += [again.model_dump(exclude_none=True), {"type": "function_call_output", "call_id": again.call_id,
                                                    "output": "x = 1"}]
    answer = respond(tools_server, input=items, tools=TOOLS, max_output_tokens=8)
    assert [o.type for o in answer.output] == ["message"] and answer.output_text
    assert answer.usage.input_tokens_details.cached_tokens > 0


def test_json_schema_text_format_gives_valid_json(tools_server):
    schema = {"type": "object", "properties": {"lang": {"enum": ["py", "rs"]}}, "required": ["lang"],
              "additionalProperties": False}
    answer = respond(tools_server, input="which language?", max_output_tokens=40,
                     text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}})
    assert json.loads(answer.output_text)["lang"] in ("py", "rs")


def body(**fields) -> dict:
    return {"model": "tiny", "input": "hi", "max_output_tokens": 4, **fields}


BAD_REQUESTS = [
    ("previous_response_id", body(previous_response_id="resp_1"), "unsupported_parameter"),
    ("no input", {"model": "tiny"}, "missing_input"),
    ("an image part", body(input=[{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
     "invalid_value"),
    ("a client tool with free-form input", body(tools=[{"type": "custom", "name": "apply_patch"}]), "invalid_tools"),
    ("a namespace holding a hosted tool", body(tools=[{"type": "namespace", "name": "n", "tools": [
        {"type": "web_search"}]}]), "invalid_tools"),
    ("a function output for an unknown call", body(input=[
        {"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "call_x", "output": "1"}]),
     "unknown_tool_call_id"),
    ("tool_choice for an unknown function", body(tools=TOOLS, tool_choice={"type": "function", "name": "nope"}),
     "invalid_tool_choice"),
    ("a text format without a schema", body(text={"format": {"type": "json_schema", "name": "x"}}),
     "invalid_response_format"),
    ("a schema the grammar converter cannot build", body(text={"format": {
        "type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": "(?<=a)b"}}}), "invalid_schema"),
]


@pytest.mark.parametrize("name,request_body,code", BAD_REQUESTS, ids=[name for name, *_ in BAD_REQUESTS])
def test_bad_input_gets_an_openai_error(tools_server, name, request_body, code):
    response = httpx.post(tools_server.base_url + "/responses", json=request_body, timeout=TIMEOUT_S)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == code and "\n" not in error["message"] and "Traceback" not in error["message"]


@pytest.mark.real
def test_real_pair_tool_loop(qwen_pair):
    """As tests/test_server.py's: a forced call, its result, an auto step, an answer without tools."""
    from tests.test_server import (
        EDIT_TOOLS,
        REAL_FILE,
        REAL_TASK,
        REAL_TIMEOUT_S,
        open_worker,
        read_the_file,
        real_call_is_valid,
        serving,
    )

    tools = [{"type": "function", **t["function"]} for t in EDIT_TOOLS]
    target, draft = qwen_pair
    options = dict(model="x", tools=tools, max_output_tokens=200, temperature=0, timeout=REAL_TIMEOUT_S)
    with serving(open_worker(target, draft, n_ctx=4096, threads=None)) as server:
        items = [{"role": "user", "content": REAL_TASK}]
        first = client(server).responses.create(input=items, tool_choice="required", **options)
        [call] = [o for o in first.output if o.type == "function_call"]
        assert call.name == "read_file" and "main.py" in json.loads(call.arguments)["path"]
        items += [call.model_dump(exclude_none=True),
                  {"type": "function_call_output", "call_id": call.call_id, "output": REAL_FILE}]
        auto = client(server).responses.create(input=items, **options)
        assert auto.status == "completed"
        assert all(real_call_is_valid(o.name, json.loads(o.arguments)) for o in auto.output
                   if o.type == "function_call")
        answer = client(server).responses.create(input=items, tool_choice="none", **options)
    assert answer.status == "completed" and read_the_file(answer.output_text)
