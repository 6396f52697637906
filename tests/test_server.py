"""``localspec serve`` end to end: a real uvicorn server on 127.0.0.1, driven by the official openai client.

The fast tests serve the tiny generated pair; the ``real`` test serves the Qwen pair. Every answer is
compared with ``localspec run`` for the same messages (greedy), or with a freshly started server.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest
from typer.testing import CliRunner

from localspec.cli.app import app as cli_app
from localspec.engine.decoding.sampling import SamplingParams
from localspec.prompt_cache import PromptCache
from localspec.server.app import LocalServer, make_app
from localspec.server.request import GenerationRequest
from localspec.server.worker import GenerationWorker, Job
from localspec.session import ModelOptions, Pair, open_decoder
from tests.tiny_models import QWEN3_CODER_TOOLS_TEMPLATE, QWEN_TOOLS_TEMPLATE

N_CTX = 1024
SYSTEM = "You answer in code."
QUESTION = "the code print x"
TIMINGS = {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "predicted_per_second", "draft_n",
           "draft_n_accepted", "method"}
# Every wait on the server is bounded, so a hung server fails the test instead of hanging CI.
TIMEOUT_S = 60
# One request to the real pair on a busy 2-core machine (loading the draft, prefill, decoding).
REAL_TIMEOUT_S = 600


def open_worker(target: Path, draft: Path | None, *, n_ctx: int = N_CTX, max_queue: int = 8,
                threads: int | None = 1, prompt_cache: PromptCache | None = None) -> GenerationWorker:
    pair = Pair(target, draft, target.name)
    decoder = open_decoder(pair, ModelOptions(n_ctx=n_ctx, threads=threads), method="auto")
    return GenerationWorker(decoder, SamplingParams(temperature=0.0), max_queue=max_queue, prompt_cache=prompt_cache)


@contextmanager
def serving(worker: GenerationWorker, **app_options):
    """A real uvicorn server on a free port of 127.0.0.1, in a background thread."""
    app = make_app(worker, model_name="tiny", **app_options)
    server = LocalServer(app, worker, host="127.0.0.1", port=0, log_level="warning")
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT_S
    while server.base_url is None:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(TIMEOUT_S)
        assert not thread.is_alive(), "the server did not stop"


def client(server: LocalServer, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, timeout=TIMEOUT_S, max_retries=0)


def messages(question: str = QUESTION) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


def ask(server: LocalServer, question: str = QUESTION, **options) -> openai.types.chat.ChatCompletion:
    options = {"max_tokens": 40, "temperature": 0, **options}
    return client(server).chat.completions.create(model="tiny", messages=messages(question), **options)


def ask_streaming(server: LocalServer, question: str = QUESTION, **options) -> tuple[str, list]:
    options = {"max_tokens": 40, "temperature": 0, **options}
    chunks = list(client(server).chat.completions.create(model="tiny", messages=messages(question), stream=True,
                                                           **options))
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks


def run_text(*args: str) -> str:
    result = CliRunner().invoke(cli_app, ["run", "--json", "--threads", "1", "--temp", "0", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["text"]


def wait_for(condition) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def wait_until_idle(server: LocalServer) -> None:
    wait_for(lambda: not httpx.get(server.base_url.removesuffix("/v1") + "/health").json()["busy"])


@pytest.fixture(scope="module")
def tiny_server(tiny_target, tiny_draft):
    worker = open_worker(tiny_target, tiny_draft)
    with serving(worker) as server:
        yield server


# -- answers -----------------------------------------------------------------------------------------
def test_streamed_and_whole_answers_equal_each_other_and_run(tiny_server, tiny_target, tiny_draft):
    whole = ask(tiny_server)
    streamed, chunks = ask_streaming(tiny_server)
    expected = run_text(QUESTION, "--system", SYSTEM, "-n", "40", "--target", str(tiny_target),
                        "--draft", str(tiny_draft))
    assert whole.choices[0].message.content == streamed == expected and expected

    assert whole.object == "chat.completion" and whole.model == "tiny" and whole.id.startswith("chatcmpl-")
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens == whole.model_extra["timings"]["predicted_n"] > 0
    timings = whole.model_extra["timings"]
    assert TIMINGS <= timings.keys() and timings["method"] == "auto"
    assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"]
    assert chunks[0].choices[0].delta.role == "assistant"
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert TIMINGS <= last.model_extra["timings"].keys()
    assert all("timings" not in c.model_extra for c in chunks[:-1])


def test_stream_usage_chunk_comes_last_with_the_figures(tiny_server):
    _, chunks = ask_streaming(tiny_server, stream_options={"include_usage": True})
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert TIMINGS <= chunks[-1].model_extra["timings"].keys()
    assert all(c.usage is None for c in chunks[:-1])


def test_stop_string_and_max_tokens(tiny_server):
    full = ask(tiny_server).choices[0].message.content
    cut = full[len(full) // 2 :][:3]
    stopped = ask(tiny_server, stop=[cut])
    assert stopped.choices[0].message.content == full[: full.index(cut)]
    assert stopped.choices[0].finish_reason == "stop"
    short = ask(tiny_server, max_tokens=3)
    assert short.usage.completion_tokens == 3 and short.choices[0].finish_reason == "length"


def test_next_turn_reuses_the_cached_conversation(tiny_server):
    first = ask(tiny_server).choices[0].message.content
    history = [*messages(), {"role": "assistant", "content": first}, {"role": "user", "content": "hello world"}]
    second = client(tiny_server).chat.completions.create(model="tiny", messages=history, max_tokens=8, temperature=0)
    timings = second.model_extra["timings"]
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == timings["cache_n"] and cached > len(first) // 2
    assert timings["prompt_n"] == second.usage.prompt_tokens - cached


def test_completions_endpoint_equals_run_raw(tiny_server, tiny_target, tiny_draft):
    completion = client(tiny_server).completions.create(model="tiny", prompt="hello world", max_tokens=24,
                                                         temperature=0)
    chunks = list(client(tiny_server).completions.create(model="tiny", prompt="hello world", max_tokens=24,
                                                         temperature=0, stream=True))
    expected = run_text("hello world", "--raw", "-n", "24", "--target", str(tiny_target), "--draft", str(tiny_draft))
    assert completion.choices[0].text == "".join(c.choices[0].text for c in chunks) == expected
    assert completion.object == "text_completion" and TIMINGS <= completion.model_extra["timings"].keys()
    assert chunks[-1].choices[0].finish_reason == completion.choices[0].finish_reason


def test_health_and_models(tiny_server):
    root = tiny_server.base_url.removesuffix("/v1")
    assert httpx.get(root + "/health").json() == {"status": "ok", "busy": False, "queued": 0}
    assert [m.id for m in client(tiny_server).models.list()] == ["tiny"]
    missing = httpx.get(root + "/v1/nothing")
    assert missing.status_code == 404 and set(missing.json()["error"]) == {"message", "type", "code"}
    wrong_method = httpx.get(tiny_server.base_url + "/chat/completions")
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["code"] == "method_not_allowed"


def test_two_concurrent_clients_are_both_answered_correctly(tiny_server):
    questions = ["the code print x", "hello world return"]
    expected = {q: ask(tiny_server, q).choices[0].message.content for q in questions}
    answers: dict[str, str] = {}

    def answer(question: str) -> None:
        answers[question] = ask_streaming(tiny_server, question)[0]

    threads = [threading.Thread(target=answer, args=(q,)) for q in questions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(TIMEOUT_S)
    assert answers == expected


# -- stopping and queueing -----------------------------------------------------------------------------
def test_disconnect_stops_the_generation_and_leaves_the_caches_consistent(tiny_target, tiny_draft):
    # A long context, so that the whole answer would take seconds even for the tiny model.
    n_ctx = 8192
    worker = open_worker(tiny_target, tiny_draft, n_ctx=n_ctx)
    with serving(worker) as server:
        body = {"model": "tiny", "messages": messages(), "stream": True, "temperature": 0, "max_tokens": n_ctx}
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=TIMEOUT_S) as response:
            lines = (line for line in response.iter_lines() if line)
            assert next(lines).startswith("data: ")  # the opening chunk
            # Before the prefill, and after each of its chunks: an SSE comment, so a long prefill is no silence.
            assert next(lines).startswith(": prefill 0/")
            assert next(line for line in lines if not line.startswith(":")).startswith("data: ")  # generating
        wait_until_idle(server)
        stats = worker.decoder.stats
        # Closed early (no stop reason), long before the context filled up.
        assert stats.stop_reason is None and stats.generated_tokens < n_ctx // 2
        # A client that gives up waiting for a whole (non-streamed) answer stops it too.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.base_url + "/chat/completions", json={**body, "stream": False}, timeout=0.5)
        wait_until_idle(server)
        assert worker.decoder.stats is not stats  # this request did start generating
        stats = worker.decoder.stats
        assert stats.stop_reason is None and stats.generated_tokens < n_ctx // 2
        after = ask(server).choices[0].message.content
        after_other = ask(server, "hello world").choices[0].message.content
    with serving(open_worker(tiny_target, tiny_draft, n_ctx=n_ctx)) as fresh:
        assert ask(fresh).choices[0].message.content == after
        assert ask(fresh, "hello world").choices[0].message.content == after_other


def test_a_full_queue_answers_429(tiny_target, tiny_draft):
    worker = open_worker(tiny_target, tiny_draft, max_queue=1)
    release = threading.Event()
    # A job that holds the worker until released: its first piece waits here, on the worker thread.
    blocker = Job(GenerationRequest(messages=messages(), max_tokens=4), lambda event: release.wait(TIMEOUT_S))
    with serving(worker) as server:
        worker.submit(blocker)
        wait_for(lambda: worker.busy)
        queued: list = []
        waiting = threading.Thread(target=lambda: queued.append(ask(server)))
        waiting.start()
        wait_for(lambda: worker.queued == 1)
        with pytest.raises(openai.RateLimitError) as refused:
            ask(server)
        assert refused.value.status_code == 429
        assert refused.value.body["code"] == "queue_full" and refused.value.body["type"] == "rate_limit_error"
        release.set()
        waiting.join(TIMEOUT_S)
        assert queued and queued[0].choices[0].message.content


# -- security ----------------------------------------------------------------------------------------
def test_api_key_is_required_and_never_echoed(tiny_target, tiny_draft):
    with serving(open_worker(tiny_target, tiny_draft), api_key="s3cret-key") as server:
        with pytest.raises(openai.AuthenticationError) as refused:
            client(server, key="wrong-guess-123").models.list()
        assert refused.value.status_code == 401
        assert "wrong-guess-123" not in refused.value.response.text
        assert "s3cret-key" not in refused.value.response.text
        no_header = httpx.post(server.base_url + "/chat/completions", json={"messages": messages()})
        assert no_header.status_code == 401 and set(no_header.json()["error"]) == {"message", "type", "code"}
        answer = client(server, key="s3cret-key").chat.completions.create(model="tiny", messages=messages(),
                                                                          max_tokens=4)
        assert answer.choices[0].message.content is not None
        assert httpx.get(server.base_url.removesuffix("/v1") + "/health").status_code == 200


def test_cors_only_for_the_given_origin(tiny_target):
    origin = "http://localhost:3000"
    worker = open_worker(tiny_target, None)
    with serving(worker) as server:
        plain = httpx.get(server.base_url + "/models", headers={"Origin": origin})
        assert "access-control-allow-origin" not in plain.headers
    with serving(open_worker(tiny_target, None), cors_origin=origin) as server:
        allowed = httpx.get(server.base_url + "/models", headers={"Origin": origin})
        assert allowed.headers["access-control-allow-origin"] == origin
        other = httpx.get(server.base_url + "/models", headers={"Origin": "http://evil.example"})
        assert "access-control-allow-origin" not in other.headers


# -- tool calls and constrained output ------------------------------------------------------------------
# An enum keeps a random tiny model's forced call short and checkable.
READ_TOOL = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file of the project",
    "parameters": {"type": "object", "properties": {"path": {"type": "string", "enum": ["a.py", "b.py"]}},
                   "required": ["path"], "additionalProperties": False}}}
LINES_TOOL = {"type": "function", "function": {
    "name": "count_lines", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}
TOOL_QUESTION = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "fix a.py"}]
FORCE_READ = {"type": "function", "function": {"name": "read_file"}}
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "lang": {"enum": ["py", "rs"]}},
          "required": ["ok", "lang"], "additionalProperties": False}


@contextmanager
def serving_template(make_tiny_model, name: str, template: str):
    """The tiny pair with ``template`` as its chat template, served."""
    target = make_tiny_model(f"{name}-target", seed=0, logit_scale=8.0, chat_template=template)
    draft = make_tiny_model(f"{name}-draft", seed=0, logit_scale=8.0, perturb_seed=1, perturb_scale=0.5,
                            chat_template=template)
    # The tool listing alone is ~650 tokens in the tiny byte-level vocabulary.
    with serving(open_worker(target, draft, n_ctx=2048)) as server:
        yield server


@pytest.fixture(scope="module")
def tools_server(make_tiny_model):
    """The tiny pair with Qwen2.5's tool-calling template (hermes syntax)."""
    with serving_template(make_tiny_model, "tools", QWEN_TOOLS_TEMPLATE) as server:
        yield server


def call_tools(server: LocalServer, history: list[dict], **options) -> openai.types.chat.ChatCompletion:
    options = {"max_tokens": 120, "temperature": 0, "tools": [READ_TOOL, LINES_TOOL], **options}
    return client(server).chat.completions.create(model="tiny", messages=history, **options)


def test_a_forced_call_is_valid_and_streams_as_openai_deltas(tools_server):
    whole = call_tools(tools_server, TOOL_QUESTION, tool_choice=FORCE_READ)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "read_file" and call.id.startswith("call_")
    assert json.loads(call.function.arguments)["path"] in ("a.py", "b.py")
    # Forced tokens (the wrapper, the name, the keys) are drafted by the grammar and all accepted.
    by_method = whole.model_extra["timings"]["by_source"]
    assert by_method["grammar"]["drafted"] == by_method["grammar"]["accepted"] > 10

    options = dict(model="tiny", messages=TOOL_QUESTION, tools=[READ_TOOL, LINES_TOOL], tool_choice=FORCE_READ,
                   max_tokens=120, temperature=0)
    with client(tools_server).chat.completions.stream(**options) as stream:  # the SDK's own assembler
        chunks = [event.chunk for event in stream if event.type == "chunk"]
        final = stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls
    assert streamed.function.name == "read_file" and streamed.function.arguments == call.function.arguments
    assert final.choices[0].finish_reason == "tool_calls"
    deltas = [c.choices[0].delta.tool_calls[0] for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    assert deltas[0].id and deltas[0].function.name == "read_file" and deltas[0].index == 0
    assert all(d.id is None and d.function.name is None and d.index == 0 for d in deltas[1:])


def test_required_lets_the_model_pick_among_the_tools_and_parallel_calls_are_honoured(tools_server):
    counts = {}
    for parallel in (None, False, True):
        options = {} if parallel is None else {"parallel_tool_calls": parallel}
        answer = call_tools(tools_server, TOOL_QUESTION, tool_choice="required", max_tokens=400, **options)
        assert answer.choices[0].finish_reason == "tool_calls"
        for call in answer.choices[0].message.tool_calls:
            assert call.function.name in ("read_file", "count_lines")
            assert isinstance(json.loads(call.function.arguments), dict)
        counts[parallel] = len(answer.choices[0].message.tool_calls)
    assert counts[None] == counts[False] == 1  # one call unless parallel calls are asked for


def test_a_three_step_tool_loop(tools_server):
    history = list(TOOL_QUESTION)
    first = call_tools(tools_server, history, tool_choice=FORCE_READ)
    [call] = first.choices[0].message.tool_calls
    history += [first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "print('hello')"}]
    second = call_tools(tools_server, history, tool_choice=FORCE_READ)
    [again] = second.choices[0].message.tool_calls
    history += [second.choices[0].message.model_dump(), {"role": "tool", "tool_call_id": again.id, "content": "x = 1"}]
    answer = call_tools(tools_server, history, max_tokens=8)
    assert answer.choices[0].finish_reason == "length" and answer.choices[0].message.tool_calls is None
    assert answer.choices[0].message.content
    # Each turn resends the conversation; the server evaluates only what its cache lacks.
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert answer.usage.prompt_tokens_details.cached_tokens >= second.usage.prompt_tokens


@pytest.fixture(scope="module")
def coder_server(make_tiny_model):
    """The tiny pair with Qwen3-Coder's tool-calling template (XML calls)."""
    with serving_template(make_tiny_model, "coder", QWEN3_CODER_TOOLS_TEMPLATE) as server:
        yield server


@pytest.mark.parametrize("question", ["fix a.py", "the code print x", "count the lines of b.py"])
def test_forced_qwen3_coder_calls_are_valid_calls_of_the_tools_asked_for(coder_server, question):
    history = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    named = call_tools(coder_server, history, tool_choice=FORCE_READ)
    assert named.choices[0].finish_reason == "tool_calls" and named.choices[0].message.content is None
    [call] = named.choices[0].message.tool_calls
    assert call.function.name == "read_file" and json.loads(call.function.arguments)["path"] in ("a.py", "b.py")
    options = dict(model="tiny", messages=history, tools=[READ_TOOL, LINES_TOOL], tool_choice=FORCE_READ,
                   max_tokens=120, temperature=0)
    with client(coder_server).chat.completions.stream(**options) as stream:
        [streamed] = stream.get_final_completion().choices[0].message.tool_calls
    assert streamed.function.name == "read_file" and streamed.function.arguments == call.function.arguments
    lines = {"type": "function", "function": {**LINES_TOOL["function"], "parameters": {
        **LINES_TOOL["function"]["parameters"], "required": ["n"]}}}  # a value written as JSON
    count = call_tools(coder_server, history, tools=[READ_TOOL, lines],
                       tool_choice={"type": "function", "function": {"name": "count_lines"}})
    [call] = count.choices[0].message.tool_calls
    assert call.function.name == "count_lines" and isinstance(json.loads(call.function.arguments)["n"], int)
    for seed in range(3):
        required = call_tools(coder_server, history, tool_choice="required", temperature=1.0, seed=seed)
        assert required.choices[0].finish_reason == "tool_calls"
        [call] = required.choices[0].message.tool_calls
        arguments = json.loads(call.function.arguments)
        if call.function.name == "read_file":
            assert arguments["path"] in ("a.py", "b.py")
        else:
            assert call.function.name == "count_lines" and isinstance(arguments.get("n", 0), int)


def test_a_template_without_tool_syntax_gets_the_generic_format(tiny_server):
    """CHAT_TEMPLATE never reads ``tools``: the tools go into the system message, calls are <tool_call> JSON,
    and earlier calls and results are written into the chat as text."""
    history = list(TOOL_QUESTION)
    first = call_tools(tiny_server, history, tool_choice=FORCE_READ, tools=[READ_TOOL])
    [call] = first.choices[0].message.tool_calls
    assert call.function.name == "read_file" and json.loads(call.function.arguments)["path"] in ("a.py", "b.py")
    without = call_tools(tiny_server, history, tool_choice="none", tools=[READ_TOOL], max_tokens=1)
    assert first.usage.prompt_tokens > without.usage.prompt_tokens + 50  # the tool listing
    history += [first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "print('hello')"}]
    second = call_tools(tiny_server, history, tools=[READ_TOOL], max_tokens=4)
    assert second.usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens


def test_a_rare_schema_keyword_is_ignored_in_a_tool_and_refused_in_a_response_format(tools_server):
    schema = {"type": "object", "properties": {"path": {"enum": ["a.py"]}}, "required": ["path"],
              "dependentRequired": {"path": ["mode"]}}  # not implemented by llguidance
    tool = {"type": "function", "function": {"name": "read_file", "parameters": schema}}
    called = call_tools(tools_server, TOOL_QUESTION, tools=[tool], tool_choice=FORCE_READ)
    assert json.loads(called.choices[0].message.tool_calls[0].function.arguments) == {"path": "a.py"}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    with pytest.raises(openai.BadRequestError, match="dependentRequired"):
        client(tools_server).chat.completions.create(model="tiny", messages=TOOL_QUESTION, response_format=fmt)


def test_tools_reach_the_template_and_none_keeps_them_out(tools_server):
    with_tools = call_tools(tools_server, TOOL_QUESTION, max_tokens=1)
    without = call_tools(tools_server, TOOL_QUESTION, max_tokens=1, tool_choice="none")
    assert with_tools.usage.prompt_tokens > without.usage.prompt_tokens + 100


def test_json_schema_and_json_object_answers_parse(tools_server):
    fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}}
    answer = client(tools_server).chat.completions.create(model="tiny", messages=TOOL_QUESTION, max_tokens=60,
                                                          temperature=0, response_format=fmt)
    value = json.loads(answer.choices[0].message.content)
    assert set(value) == {"ok", "lang"} and isinstance(value["ok"], bool) and value["lang"] in ("py", "rs")
    assert answer.choices[0].finish_reason == "stop"
    sampled = client(tools_server).chat.completions.create(
        model="tiny", messages=TOOL_QUESTION, max_tokens=60, temperature=1.0, seed=3,
        response_format={"type": "json_object"})
    assert isinstance(json.loads(sampled.choices[0].message.content), dict)


# -- bad input ---------------------------------------------------------------------------------------
def chat_body(**fields) -> dict:
    return {"model": "tiny", "messages": messages(), "max_tokens": 4, **fields}


BAD_REQUESTS = [
    ("malformed JSON", b'{"messages": [', 400, "invalid_json"),
    ("not an object", b"[1, 2]", 400, "invalid_json"),
    ("no messages", {"model": "tiny"}, 400, "missing_messages"),
    ("empty messages", chat_body(messages=[]), 400, "missing_messages"),
    ("messages not a list", chat_body(messages="hi"), 400, "missing_messages"),
    ("message not an object", chat_body(messages=["hi"]), 400, "invalid_value"),
    ("unknown role", chat_body(messages=[{"role": "wizard", "content": "hi"}]), 400, "invalid_role"),
    ("tool result without a call id", chat_body(messages=[{"role": "tool", "content": "hi"}]), 400, "invalid_value"),
    ("tool result for an unknown call", chat_body(messages=[
        {"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_x", "content": "42"}]),
     400, "unknown_tool_call_id"),
    ("tool call arguments not an object", chat_body(messages=[
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]), 400, "invalid_value"),
    ("tool not a function", chat_body(tools=[{"type": "retrieval"}]), 400, "invalid_tools"),
    ("tool name with a space", chat_body(tools=[{"type": "function", "function": {"name": "read file"}}]),
     400, "invalid_tools"),
    ("tool parameters not an object schema", chat_body(tools=[
        {"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]), 400, "invalid_tools"),
    ("tool_choice names an unknown tool", chat_body(tools=[READ_TOOL], tool_choice={
        "type": "function", "function": {"name": "write_file"}}), 400, "invalid_tool_choice"),
    ("tool_choice required without tools", chat_body(tool_choice="required"), 400, "invalid_tool_choice"),
    ("tool_choice unknown", chat_body(tools=[READ_TOOL], tool_choice="always"), 400, "invalid_tool_choice"),
    ("functions", chat_body(functions=[{"name": "f"}]), 400, "unsupported_parameter"),
    ("response_format unknown", chat_body(response_format={"type": "xml"}), 400, "invalid_response_format"),
    ("json_schema without a schema", chat_body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     400, "invalid_response_format"),
    ("a schema the grammar converter cannot build", chat_body(response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/nope"}}}),
     400, "invalid_schema"),
    ("content a number", chat_body(messages=[{"role": "user", "content": 5}]), 400, "invalid_value"),
    ("image part", chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     400, "invalid_value"),
    ("temperature a string", chat_body(temperature="hot"), 400, "invalid_value"),
    ("temperature true", chat_body(temperature=True), 400, "invalid_value"),
    ("temperature out of range", chat_body(temperature=9), 400, "invalid_value"),
    ("max_tokens negative", chat_body(max_tokens=-1), 400, "invalid_value"),
    ("max_tokens fractional", chat_body(max_tokens=2.5), 400, "invalid_value"),
    ("stream a string", chat_body(stream="yes"), 400, "invalid_value"),
    ("stop a number", chat_body(stop=7), 400, "invalid_value"),
    ("n > 1", chat_body(n=2), 400, "invalid_value"),
    ("penalty", chat_body(presence_penalty=1.0), 400, "unsupported_parameter"),
    ("logprobs", chat_body(logprobs=True), 400, "unsupported_parameter"),
]


@pytest.mark.parametrize("body, status, code", [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS])
def test_bad_input_gets_an_openai_error(tiny_server, body, status, code):
    sent = {"content": body} if isinstance(body, bytes) else {"json": body}
    response = httpx.post(tiny_server.base_url + "/chat/completions", timeout=TIMEOUT_S,
                          headers={"Content-Type": "application/json"}, **sent)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "code"} and error["code"] == code
    assert error["type"] == "invalid_request_error" and "Traceback" not in error["message"]


def test_bad_completion_requests(tiny_server):
    for body in ({"prompt": ""}, {"prompt": [1, 2, 3]}, {"prompt": "hi", "echo": True}, {"prompt": "hi", "best_of": 3}):
        response = httpx.post(tiny_server.base_url + "/completions", json=body)
        assert response.status_code == 400 and set(response.json()["error"]) == {"message", "type", "code"}, body


def test_a_prompt_longer_than_the_context_is_refused_with_the_counts(tiny_server):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(tiny_server, "x " * N_CTX)
    error = refused.value.body
    assert error["code"] == "context_length_exceeded"
    assert f"context window is {N_CTX} tokens" in error["message"]
    prompt_tokens = int(error["message"].split("the prompt is ")[1].split(" tokens")[0])
    assert prompt_tokens > N_CTX
    # A streaming request gets the same HTTP error, before any event.
    with pytest.raises(openai.BadRequestError):
        ask_streaming(tiny_server, "x " * N_CTX)
    assert ask(tiny_server, max_tokens=2).usage.completion_tokens == 2  # and the server carries on


def test_an_oversized_body_is_refused(tiny_server):
    big = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * (5 * 1024 * 1024)}]))
    response = httpx.post(tiny_server.base_url + "/chat/completions", content=big, timeout=TIMEOUT_S,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"


# -- the command ---------------------------------------------------------------------------------------
def test_serve_command_prints_the_url_and_stops_on_ctrl_c_without_leaking_secrets(tiny_target, tiny_draft):
    key, token = "k3y-never-shown", "hf_token_never_shown"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_TOKEN": token, "LOCALSPEC_API_KEY": key}
    proc = subprocess.Popen(
        [sys.executable, "-m", "localspec", "serve", "--target", str(tiny_target), "--draft", str(tiny_draft),
         "--port", "0", "--threads", "1", "--ctx", "8192"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True,
    )
    try:
        first = proc.stdout.readline()
        assert "http://127.0.0.1:" in first, first + proc.stderr.read()
        base_url = first.split(" at ")[1].strip()
        answer = openai.OpenAI(base_url=base_url, api_key=key, timeout=TIMEOUT_S, max_retries=0)
        assert answer.chat.completions.create(model="x", messages=messages(), max_tokens=4).choices
        # Ctrl-C while an answer streams: the stream ends with an error event, the server exits at once.
        body = {"messages": messages(), "stream": True, "max_tokens": 8000}  # seconds of work
        with httpx.stream("POST", base_url + "/chat/completions", json=body, timeout=TIMEOUT_S,
                          headers={"Authorization": f"Bearer {key}"}) as streaming:
            lines = streaming.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
            rest = [line for line in lines if line]
    finally:
        proc.kill()
    assert proc.returncode == 0 and "stopped" in stderr and "Traceback" not in stderr
    assert json.loads(rest[-1].removeprefix("data: "))["error"]["code"] == "shutting_down"
    assert stdout == ""  # stdout carries only the base URL; the access log goes to stderr
    assert '"POST /v1/chat/completions HTTP/1.1" 200' in stderr
    assert "prompt tokens (0 reused) | 4 tokens" in stderr  # each answer's figures
    for secret in (key, token):
        assert secret not in first + stdout + stderr


def test_serve_names_the_fix_when_the_port_is_taken(tiny_target):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(cli_app, ["serve", "--target", str(tiny_target), "--port", str(port),
                                              "--threads", "1"])
    assert result.exit_code == 2 and "pick another --port" in result.output


def test_serve_refuses_another_interface_without_a_key(tiny_target):
    result = CliRunner().invoke(cli_app, ["serve", "--target", str(tiny_target), "--host", "0.0.0.0"],
                                env={"LOCALSPEC_API_KEY": ""})
    assert result.exit_code == 2 and "--api-key" in result.output and "Traceback" not in result.output


def test_the_server_imports_neither_the_tui_nor_rich_nor_typer():
    """Its log line is plain text: the Rich TUI (and the CLI framework) stay out of the server process's imports."""
    code = ("import sys, localspec.server.app, localspec.server.worker; "
            "print(sorted(m for m in ('localspec.tui', 'rich', 'typer') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


# -- the real pair ---------------------------------------------------------------------------------------
@pytest.mark.real
def test_real_pair_stream_whole_and_run_agree(qwen_pair):
    target, draft = qwen_pair
    question = "Write a Python function that returns the square of a number."
    worker = open_worker(target, draft, n_ctx=1024, threads=None)
    with serving(worker) as server:
        whole = ask(server, question, max_tokens=24, timeout=REAL_TIMEOUT_S)  # a fresh server's answer
        streamed, chunks = ask_streaming(server, question, max_tokens=24, timeout=REAL_TIMEOUT_S)
        followup = [*messages(question), {"role": "assistant", "content": streamed},
                    {"role": "user", "content": "Now rename it."}]
        second = client(server).chat.completions.create(model="x", messages=followup, max_tokens=8, temperature=0,
                                                        timeout=REAL_TIMEOUT_S)
        body = {"messages": followup, "stream": True, "temperature": 0, "max_tokens": 200}
        with httpx.stream("POST", server.base_url + "/chat/completions", json=body, timeout=REAL_TIMEOUT_S) as response:
            lines = response.iter_lines()
            for _ in range(6):  # the opening chunk and two pieces, each line followed by a blank one
                next(lines)
        wait_until_idle(server)
        assert worker.decoder.stats.stop_reason is None and worker.decoder.stats.generated_tokens < 200
        again = ask(server, question, max_tokens=24, timeout=REAL_TIMEOUT_S)
    expected = run_text(question, "--system", SYSTEM, "-n", "24", "--target", str(target), "--draft", str(draft),
                        "--ctx", "1024", "--threads", str(worker.decoder.target.n_threads))
    assert whole.choices[0].message.content == streamed == expected == again.choices[0].message.content
    assert TIMINGS <= chunks[-1].model_extra["timings"].keys()
    assert second.usage.prompt_tokens_details.cached_tokens > whole.usage.prompt_tokens


# On the real pair: every forced call and every schema answer parses and follows its schema.
EDIT_TOOLS = [
    {"type": "function", "function": {"name": "read_file", "description": "Read a file of the project",
                                      "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                     "required": ["path"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "run_command", "description": "Run a shell command",
                                      "parameters": {"type": "object", "properties": {
                                          "command": {"type": "string"}, "timeout_s": {"type": "integer"}},
                                          "required": ["command"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "replace_in_file", "description": "Replace text in a file",
                                      "parameters": {"type": "object", "properties": {
                                          "path": {"type": "string"}, "old": {"type": "string"},
                                          "new": {"type": "string"}},
                                          "required": ["path", "old", "new"], "additionalProperties": False}}},
]
REAL_PROMPTS = [
    "What is in setup.py?",
    "Run the test suite with pytest.",
    "Rename the function foo to bar in utils/strings.py.",
    "Why does `import numpy` fail on this machine?",
    "Show me the README.",
    "Count the lines of Python in src/.",
    "Fix the typo 'recieve' in docs/api.md.",
    "Is port 8080 in use?",
    "Replace print statements with logging in app/main.py.",
    "Check which version of Python is installed.",
]
VERDICT = {"type": "object", "properties": {
    "summary": {"type": "string"}, "difficulty": {"enum": ["easy", "medium", "hard"]},
    "files": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
    "required": ["summary", "difficulty", "files"], "additionalProperties": False}


def follows(value: dict, schema: dict) -> bool:
    """Enough of JSON schema for the schemas above: required keys, no others, and each property's type."""
    types = {"string": str, "integer": int, "array": list}
    properties = schema["properties"]
    return (isinstance(value, dict) and set(schema["required"]) <= value.keys() <= properties.keys()
            and all(value[k] in p["enum"] if "enum" in p else isinstance(value[k], types[p["type"]])
                    for k, p in properties.items() if k in value))


@pytest.mark.real
def test_real_pair_forced_tool_calls_and_json_schemas_are_valid_on_ten_prompts(qwen_pair):
    target, draft = qwen_pair
    with serving(open_worker(target, draft, n_ctx=4096, threads=None)) as server:
        openai_client = client(server)
        for prompt in REAL_PROMPTS:
            history = [{"role": "user", "content": prompt}]
            called = openai_client.chat.completions.create(
                model="x", messages=history, tools=EDIT_TOOLS, tool_choice="required", max_tokens=300,
                temperature=0, timeout=REAL_TIMEOUT_S)
            assert called.choices[0].finish_reason == "tool_calls", prompt
            schemas = {t["function"]["name"]: t["function"]["parameters"] for t in EDIT_TOOLS}
            for call in called.choices[0].message.tool_calls:
                assert follows(json.loads(call.function.arguments), schemas[call.function.name]), (prompt, call)
            fmt = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True}}
            judged = openai_client.chat.completions.create(
                model="x", messages=history, response_format=fmt, max_tokens=300, temperature=0,
                timeout=REAL_TIMEOUT_S)
            assert judged.choices[0].finish_reason == "stop", prompt
            assert follows(json.loads(judged.choices[0].message.content), VERDICT), (prompt, judged)


REAL_FILE = "def add(a, b):\n    return a + b\n"
REAL_TASK = "What does main.py do? Read it, then answer in one sentence."


def read_the_file(answer: str) -> bool:
    """Whether an answer about REAL_FILE shows the model read the tool result."""
    return any(word in answer.lower() for word in ("add", "sum"))


def real_call_is_valid(name: str, arguments: dict) -> bool:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in EDIT_TOOLS}
    return name in schemas and follows(arguments, schemas[name])


@pytest.mark.real
def test_real_pair_tool_loop(qwen_pair):
    """Call (forced), result, then whatever the model does in auto mode (a text answer or a valid call),
    then an answer with tool_choice 'none'."""
    target, draft = qwen_pair
    with serving(open_worker(target, draft, n_ctx=4096, threads=None)) as server:
        history = [{"role": "user", "content": REAL_TASK}]
        first = call_tools(server, history, tools=EDIT_TOOLS, tool_choice="required", max_tokens=200,
                           timeout=REAL_TIMEOUT_S)
        [call] = first.choices[0].message.tool_calls
        assert call.function.name == "read_file" and "main.py" in json.loads(call.function.arguments)["path"]
        history += [first.choices[0].message.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": call.id, "content": REAL_FILE}]
        auto = call_tools(server, history, tools=EDIT_TOOLS, max_tokens=200, timeout=REAL_TIMEOUT_S)
        calls = auto.choices[0].message.tool_calls or []
        assert auto.choices[0].finish_reason == ("tool_calls" if calls else "stop")
        assert all(real_call_is_valid(c.function.name, json.loads(c.function.arguments)) for c in calls)
        answer = call_tools(server, history, tools=EDIT_TOOLS, tool_choice="none", max_tokens=200,
                            timeout=REAL_TIMEOUT_S)
    assert answer.choices[0].finish_reason == "stop" and read_the_file(answer.choices[0].message.content)
    assert auto.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
