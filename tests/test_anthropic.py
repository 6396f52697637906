"""/v1/messages end to end: a real server driven by the official ``anthropic`` client, as Claude Code drives it."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from tests.test_server import (  # noqa: F401 (tiny_server and tools_server are fixtures)
    QUESTION,
    READ_TOOL,
    SYSTEM,
    TIMEOUT_S,
    ask,
    open_worker,
    serving,
    tiny_server,
    tools_server,
)

TOOLS = [{"name": f["name"], "description": f.get("description", ""), "input_schema": f["parameters"]}
         for f in (READ_TOOL["function"],)]
FORCE_READ = {"type": "tool", "name": "read_file"}
ASK = [{"role": "user", "content": "fix a.py"}]


def client(server, key: str = "unused") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key=key, timeout=TIMEOUT_S,
                               max_retries=0)


def create(server, messages=None, **options) -> anthropic.types.Message:
    options = {"max_tokens": 40, "system": SYSTEM, **options}  # the test server is greedy
    return client(server).messages.create(model="tiny", messages=messages or [{"role": "user", "content": QUESTION}],
                                          **options)


def test_text_whole_and_streamed_equal_the_chat_completion(tiny_server):
    whole = create(tiny_server)
    with client(tiny_server).messages.stream(model="tiny", max_tokens=40, system=SYSTEM,
                                             messages=[{"role": "user", "content": QUESTION}]) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    expected = ask(tiny_server).choices[0].message.content
    assert [b.text for b in whole.content] == [b.text for b in final.content] == [expected]
    assert whole.type == "message" and whole.role == "assistant" and whole.id.startswith("msg")
    assert whole.stop_reason in ("end_turn", "max_tokens") and final.stop_reason == whole.stop_reason
    assert whole.usage.output_tokens == final.usage.output_tokens > 0
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens > 0
    assert whole.model_extra["timings"]["method"] == "auto"
    # Anthropic's order: message_start, then each block's start / deltas / stop, then message_delta, message_stop.
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    body = [e for e in events[1:-2] if e not in ("ping", "text")]
    assert body[0] == "content_block_start" and body[-1] == "content_block_stop"
    assert set(body[1:-1]) == {"content_block_delta"}


def test_stop_sequences_and_max_tokens_give_anthropic_stop_reasons(tiny_server):
    full = create(tiny_server).content[0].text
    cut = full[len(full) // 2:][:3]
    stopped = create(tiny_server, stop_sequences=[cut])
    assert stopped.content[0].text == full[: full.index(cut)]
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == cut
    short = create(tiny_server, max_tokens=3)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


def test_count_tokens_matches_the_prompt_the_answer_used(tiny_server):
    counted = client(tiny_server).messages.count_tokens(
        model="tiny", system=SYSTEM, messages=[{"role": "user", "content": QUESTION}])
    answer = create(tiny_server)
    assert counted.input_tokens == answer.usage.input_tokens + answer.usage.cache_read_input_tokens > 0


def test_a_three_step_tool_loop_with_streamed_tool_use(tools_server):
    history = list(ASK)
    first = create(tools_server, history, tools=TOOLS, tool_choice=FORCE_READ, max_tokens=120)
    assert first.stop_reason == "tool_use"
    [use] = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "read_file" and use.input["path"] in ("a.py", "b.py")
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "print(1)"}]}]

    with client(tools_server).messages.stream(model="tiny", messages=history, system=SYSTEM, tools=TOOLS,
                                              tool_choice=FORCE_READ, max_tokens=120) as stream:
        kinds = [event.type for event in stream]
        second = stream.get_final_message()
    [again] = [b for b in second.content if b.type == "tool_use"]
    assert second.stop_reason == "tool_use" and again.name == "read_file" and again.input == use.input
    assert "input_json" in kinds  # the SDK saw input_json_delta events and assembled the input from them
    history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": again.id,
                                              "content": [{"type": "text", "text": "x = 1"}]},
                                             {"type": "text", "text": "now answer"}]}]
    answer = create(tools_server, history, tools=TOOLS, max_tokens=8)
    assert answer.stop_reason == "max_tokens" and [b.type for b in answer.content] == ["text"]
    assert answer.usage.cache_read_input_tokens > second.usage.cache_read_input_tokens > 0


def test_x_api_key_is_accepted_as_well_as_bearer(tiny_target):
    with serving(open_worker(tiny_target, None), api_key="s3cret") as server:
        answer = client(server, "s3cret").messages.create(model="tiny", max_tokens=2, messages=ASK)
        assert answer.usage.output_tokens == 2
        with pytest.raises(anthropic.AuthenticationError) as error:
            client(server, "wrong").messages.create(model="tiny", max_tokens=2,
                                                    messages=[{"role": "user", "content": "hi"}])
        assert error.value.body["type"] == "error" and "x-api-key" in error.value.body["error"]["message"]


def messages_body(**fields) -> dict:
    return {"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **fields}


BAD_REQUESTS = [
    ("no max_tokens", {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}),
    ("no messages", messages_body(messages=[])),
    ("a developer role in messages", messages_body(messages=[{"role": "developer", "content": "hi"}])),
    ("an image block", messages_body(messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}])),
    ("a client tool without a schema", messages_body(tools=[{"type": "bash_20250124", "name": "bash"}])),
    ("thinking of an unknown type", messages_body(thinking={"type": "sometimes"})),
    ("a tool without a name", messages_body(tools=[{"input_schema": {"type": "object"}}])),
    ("a tool result for an unknown call", messages_body(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "42"}]}])),
    ("tool_use input not an object", messages_body(messages=[
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": [1]}]}])),
    ("tool_choice for an unknown tool", messages_body(tools=TOOLS, tool_choice={"type": "tool", "name": "nope"})),
    ("tool_choice unknown", messages_body(tools=TOOLS, tool_choice={"type": "sometimes"})),
    ("a schema the grammar converter cannot build", messages_body(
        tools=[{"name": "f", "input_schema": {"type": "object", "properties": {"n": {
            "type": "integer", "minimum": 5, "maximum": 1}}, "required": ["n"]}}], tool_choice={"type": "any"})),
    ("stop_sequences a number", messages_body(stop_sequences=3)),
    ("temperature above 1", messages_body(temperature=1.5)),
]


@pytest.mark.parametrize("name,body", BAD_REQUESTS, ids=[name for name, _ in BAD_REQUESTS])
def test_bad_input_gets_an_anthropic_error(tools_server, name, body):
    response = httpx.post(tools_server.base_url + "/messages", json=body, timeout=TIMEOUT_S)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    message = error["error"]["message"]
    assert message and "\n" not in message and "Traceback" not in message


def test_a_stream_refused_before_its_first_token_is_a_plain_anthropic_400(tools_server):
    body = {**dict(BAD_REQUESTS)["a schema the grammar converter cannot build"], "stream": True}
    response = httpx.post(tools_server.base_url + "/messages", json=body, timeout=TIMEOUT_S)
    assert response.status_code == 400 and response.headers["content-type"] == "application/json"
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.real
def test_real_pair_tool_loop(qwen_pair):
    """As tests/test_server.py's: a forced call, its result, an auto step, an answer without tools."""
    from tests.test_server import (
        EDIT_TOOLS,
        REAL_FILE,
        REAL_TASK,
        REAL_TIMEOUT_S,
        read_the_file,
        real_call_is_valid,
    )

    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in EDIT_TOOLS]
    target, draft = qwen_pair
    options = dict(system=anthropic.NOT_GIVEN, tools=tools, max_tokens=200, timeout=REAL_TIMEOUT_S)
    with serving(open_worker(target, draft, n_ctx=4096, threads=None)) as server:
        history = [{"role": "user", "content": REAL_TASK}]
        first = create(server, history, tool_choice={"type": "any"}, **options)
        [use] = [b for b in first.content if b.type == "tool_use"]
        assert first.stop_reason == "tool_use" and use.name == "read_file" and "main.py" in use.input["path"]
        history += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": REAL_FILE}]}]
        auto = create(server, history, **options)
        uses = [b for b in auto.content if b.type == "tool_use"]
        assert auto.stop_reason == ("tool_use" if uses else "end_turn")
        assert all(real_call_is_valid(b.name, b.input) for b in uses)
        answer = create(server, history, tool_choice={"type": "none"}, **options)
    assert answer.stop_reason == "end_turn" and read_the_file(answer.content[0].text)
