"""What real coding agents send: recorded requests of Claude Code, Codex CLI and opencode, system messages
between turns, namespace tools, hosted tools and fields, thinking switches and reasoning handed back.

The recordings (tests/data/agent-sessions/) are the clients' requests as sent; they are translated and
rendered with the tiny models here, and replayed against the real pair in test_agents_clients.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from localspec.conversation import fit_system_messages
from localspec.engine.tokens import common_prefix_length
from localspec.gguf.templates import render_chat, shows_late_system
from localspec.server.anthropic import parse_messages_request
from localspec.server.openai import parse_chat_request
from localspec.server.reasoning import ReasoningDelta, ReasoningSplitter
from localspec.server.responses import parse_responses_request
from tests.test_server import READ_TOOL, TIMEOUT_S, open_worker, serving_template
from tests.tiny_models import QWEN3_CODER_TOOLS_TEMPLATE, QWEN_TOOLS_TEMPLATE

SESSIONS = Path(__file__).parent / "data" / "agent-sessions"
PARSERS = {"/v1/messages": parse_messages_request, "/v1/responses": parse_responses_request,
           "/v1/chat/completions": parse_chat_request}
# Qwen3's switch and generation prompt: the template opens <think> itself unless thinking is off.
THINKING_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


def recorded(client: str) -> list[dict]:
    """Every request recorded from ``client`` (``claude-code``, ``codex`` or ``opencode``), in order."""
    lines = [json.loads(line) for path in sorted(SESSIONS.glob(f"{client}-*.jsonl")) for line in path.open()]
    assert lines, f"no recording of {client} in {SESSIONS}"
    return lines


def translate(line: dict):
    return PARSERS[line["path"].partition("?")[0]](line["body"])


@pytest.fixture(scope="module")
def tools_worker(make_tiny_model):
    """A worker on the tiny target with Qwen2.5's tool template, never started: it only renders prompts."""
    return open_worker(make_tiny_model("agents-target", seed=0, logit_scale=8.0, chat_template=QWEN_TOOLS_TEMPLATE),
                       None, n_ctx=2048)


# -- recorded requests -----------------------------------------------------------------------------------
def test_claude_code_requests_translate_with_their_system_messages_and_tools(tools_worker, caplog):
    for line in recorded("claude-code"):
        body = line["body"]
        with caplog.at_level(logging.DEBUG, logger="localspec.server"):
            request = translate(line)
        late = [m["content"] if isinstance(m["content"], str) else "".join(b["text"] for b in m["content"])
                for m in body["messages"] if m["role"] == "system"]
        assert late and all({"role": "system", "content": text} in request.messages for text in late)
        offered = {t["function"]["name"] for t in request.tools}
        # A tool loaded on demand (Anthropic's tool search) is not offered; the others all are.
        assert offered == {t["name"] for t in body["tools"] if not t.get("defer_loading")}
        assert "ignored what only a hosted service uses: metadata, context_management, output_config" in caplog.text
        assert request.thinking is True and request.stream and tools_worker.count_tokens(request) > 1000


def test_two_claude_code_conversations_share_their_system_prompt_and_tools(tools_worker, caplog):
    """Claude Code's first system block is billing attribution hashed from each conversation: left out, so a
    second conversation (a sub-agent, another client) finds the first one's system prompt and tools cached."""
    session = [json.loads(line) for line in (SESSIONS / "claude-code-interleaved.jsonl").open()]
    first, other = session[0], session[2]  # conversation A's first request, then B's
    assert first["body"]["system"][0]["text"] != other["body"]["system"][0]["text"]
    with caplog.at_level(logging.DEBUG, logger="localspec.server"):
        prompts = [tools_worker.prompt_tokens(translate(line)) for line in (first, other)]
    assert "left out the system block that only carries billing attribution" in caplog.text
    text = tools_worker.decoder.target.detokenize(prompts[0])
    assert "x-anthropic-billing-header" not in text and "You are a Claude agent" in text
    shared = common_prefix_length(*prompts)
    assert shared > 0.8 * min(map(len, prompts)), (shared, len(prompts[0]), len(prompts[1]))


def test_codex_requests_offer_namespaced_functions_and_leave_hosted_tools_out(tools_worker, caplog):
    for line in recorded("codex"):
        body = line["body"]
        with caplog.at_level(logging.DEBUG, logger="localspec.server"):
            request = translate(line)
        offered = {t["function"]["name"] for t in request.tools}
        namespaced = {f"{t['name']}.{f['name']}": (t["name"], f["name"])
                      for t in body["tools"] if t["type"] == "namespace" for f in t["tools"]}
        functions = {t["name"] for t in body["tools"] if t["type"] == "function"}
        assert namespaced and offered == functions | set(namespaced) and request.tool_namespaces == namespaced
        assert "left out tools the server cannot run: web_search" in caplog.text
        assert "store, include, prompt_cache_key, client_metadata" in caplog.text
        developer = [item for item in body["input"] if item.get("role") == "developer"]
        assert sum(m["role"] == "system" for m in request.messages) == len(developer)
        assert tools_worker.count_tokens(request) > 1000


def test_opencode_requests_translate(tools_worker):
    for line in recorded("opencode"):
        request = translate(line)
        assert [t["function"]["name"] for t in request.tools] == [t["function"]["name"]
                                                                   for t in line["body"].get("tools", [])]
        assert request.include_usage and tools_worker.count_tokens(request) > 100


# -- system messages between turns -----------------------------------------------------------------------
LATE_SYSTEM = [{"role": "system", "content": "S1"}, {"role": "system", "content": "S2"},
               {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
               {"role": "system", "content": "S3"}, {"role": "user", "content": "u2"}]


def test_system_messages_stay_where_the_template_shows_them():
    assert shows_late_system(QWEN_TOOLS_TEMPLATE)
    assert fit_system_messages(QWEN_TOOLS_TEMPLATE, LATE_SYSTEM) == LATE_SYSTEM


def test_a_system_message_after_user_or_tool_turns_goes_before_them():
    """Claude Code sends its environment after the user's request: the model must answer the request."""
    user, env = {"role": "user", "content": "u"}, {"role": "system", "content": "env"}
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
        "name": "f", "arguments": {}}}]}
    result = {"role": "tool", "tool_call_id": "c", "content": "r"}
    assert fit_system_messages(QWEN_TOOLS_TEMPLATE, [user, env]) == [env, user]
    # The next turn's prompt starts with the first one's: the cache keeps it.
    assert fit_system_messages(QWEN_TOOLS_TEMPLATE, [user, env, call, result, env]) == [env, user, call, env, result]


def test_a_template_that_reads_one_system_message_gets_the_others_with_the_next_user_turn():
    assert not shows_late_system(QWEN3_CODER_TOOLS_TEMPLATE)
    fitted = fit_system_messages(QWEN3_CODER_TOOLS_TEMPLATE, LATE_SYSTEM)
    assert fitted == [{"role": "system", "content": "S1\n\nS2"}, {"role": "user", "content": "u1"},
                      {"role": "assistant", "content": "a1"}, {"role": "user", "content": "S3\n\nu2"}]
    prompt = render_chat(QWEN3_CODER_TOOLS_TEMPLATE, fitted)
    assert all(text in prompt for text in ("S1", "S2", "S3"))
    # A system message with no user turn after it becomes one.
    assert fit_system_messages(QWEN3_CODER_TOOLS_TEMPLATE, LATE_SYSTEM[:4] + LATE_SYSTEM[4:5])[-1] == {
        "role": "user", "content": "S3"}


def test_a_system_message_inside_anthropic_messages_reaches_the_prompt(tools_server):
    url = tools_server.base_url + "/messages/count_tokens"
    user = {"role": "user", "content": "hi"}
    plain = httpx.post(url, json={"model": "m", "messages": [user]}, timeout=TIMEOUT_S).json()["input_tokens"]
    system = {"role": "system", "content": [{"type": "text", "text": "the environment", "cache_control": {
        "type": "ephemeral"}}]}
    with_system = httpx.post(url, json={"model": "m", "messages": [user, system, user]},
                             timeout=TIMEOUT_S).json()["input_tokens"]
    two_turns = httpx.post(url, json={"model": "m", "messages": [user, user]}, timeout=TIMEOUT_S).json()["input_tokens"]
    assert with_system > two_turns > plain


# -- hosted fields and tools ------------------------------------------------------------------------------
HOSTED = {"metadata": {"user_id": "u"}, "context_management": {"edits": []}, "output_config": {"effort": "high"},
          "service_tier": "auto"}


def test_what_steers_only_a_hosted_service_changes_nothing_in_the_answer(tools_server):
    """Claude Code's shape (``?beta=true``, hosted fields, cache hints, a server tool, a deferred tool):
    the same answer as the plain request."""
    tool = {"name": "read_file", "description": "Read a file", "input_schema": READ_TOOL["function"]["parameters"]}
    plain = {"model": "m", "max_tokens": 12, "system": "You answer in code.", "tools": [tool],
             "messages": [{"role": "user", "content": "fix a.py"}]}
    dressed = {**plain, **HOSTED, "tools": [{**tool, "cache_control": {"type": "ephemeral"}},
                                            {"type": "web_search_20250305", "name": "web_search"},
                                            {**tool, "name": "Deferred", "defer_loading": True}],
               "system": [{"type": "text", "text": "You answer in code.", "cache_control": {"type": "ephemeral"}}],
               "messages": [{"role": "user", "content": [{"type": "text", "text": "fix a.py",
                                                           "cache_control": {"type": "ephemeral"}}]}]}
    base = tools_server.base_url.removesuffix("/v1")
    first = httpx.post(base + "/v1/messages", json=plain, timeout=TIMEOUT_S).json()
    second = httpx.post(base + "/v1/messages?beta=true", json=dressed, timeout=TIMEOUT_S).json()
    assert second["content"] == first["content"]
    assert (second["usage"]["input_tokens"] + second["usage"]["cache_read_input_tokens"]
            == first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"])


def test_unknown_fields_anywhere_are_ignored(tools_server):
    base = tools_server.base_url
    odd = {"x_unknown": {"deep": [1, None]}, "another": None}
    for path, body in (
        ("/chat/completions", {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi", **odd}],
                               **odd}),
        ("/messages", {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi", **odd}], **odd}),
        ("/responses", {"model": "m", "max_output_tokens": 3, "input": [{"role": "user", "content": "hi", **odd}],
                        **odd}),
    ):
        assert httpx.post(base + path, json=body, timeout=TIMEOUT_S).status_code == 200, path


# -- namespace tools ------------------------------------------------------------------------------------
NAMESPACE = {"type": "namespace", "name": "fs", "description": "Files", "tools": [
    {"type": "function", "name": "read_file", "description": "Read a file",
     "parameters": READ_TOOL["function"]["parameters"]}]}


def test_a_namespace_tool_is_called_back_under_the_clients_names(tools_server):
    responses = openai.OpenAI(base_url=tools_server.base_url, api_key="x", timeout=TIMEOUT_S, max_retries=0).responses
    items = [{"role": "developer", "content": "You fix code."}, {"role": "user", "content": "fix a.py"}]
    first = responses.create(model="m", input=items, tools=[NAMESPACE, {"type": "web_search"}],
                             tool_choice="required", max_output_tokens=200)
    [call] = [o.model_dump() for o in first.output if o.type == "function_call"]
    assert call["name"] == "read_file" and call["namespace"] == "fs" and json.loads(call["arguments"])["path"]
    with responses.stream(model="m", input=items, tools=[NAMESPACE], tool_choice="required",
                          max_output_tokens=200) as stream:
        final = stream.get_final_response()
    assert [(o.name, o.model_dump()["namespace"]) for o in final.output] == [("read_file", "fs")]
    # The call comes back in the history with its namespace, followed by its output.
    items += [call, {"type": "function_call_output", "call_id": call["call_id"], "output": "x = 1"}]
    answer = responses.create(model="m", input=items, tools=[NAMESPACE], max_output_tokens=4)
    assert answer.status == "incomplete" and answer.usage.input_tokens_details.cached_tokens > 0


# -- thinking -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("opened,answer,reasoning,text", [
    (False, "<think>\nweigh it</think>\n\nThe answer.", "\nweigh it", "The answer."),
    (False, "  <think>a</think>b", "a", "b"),
    (False, "No thinking <think> here", "", "No thinking <think> here"),
    (True, "still thinking</thi", "still thinking</thi", ""),
    (True, "x</think>", "x", ""),
    (True, "a < b </think>\n\nc </think> d", "a < b ", "c </think> d"),
])
def test_reasoning_is_told_apart_from_the_answer_however_it_streams(opened, answer, reasoning, text, chunk):
    splitter = ReasoningSplitter(opened=opened)
    pieces = [p for i in range(0, len(answer), chunk) for p in splitter.feed(answer[i:i + chunk])]
    pieces += splitter.finish()
    assert "".join(p.text for p in pieces if isinstance(p, ReasoningDelta)) == reasoning
    assert "".join(p for p in pieces if isinstance(p, str)) == text


@pytest.fixture(scope="module")
def thinking_server(make_tiny_model):
    with serving_template(make_tiny_model, "thinking", THINKING_TEMPLATE) as server:
        yield server


def test_reasoning_comes_back_the_way_each_api_carries_it(thinking_server):
    """The tiny model never closes the <think> its template opens: its whole answer is reasoning."""
    url = thinking_server.base_url
    ask = [{"role": "user", "content": "hi"}]
    chat = openai.OpenAI(base_url=url, api_key="x", timeout=TIMEOUT_S, max_retries=0).chat.completions
    whole = chat.create(model="m", messages=ask, max_tokens=8).choices[0].message
    thought = whole.model_dump()["reasoning_content"]
    assert thought and not whole.content
    chunks = list(chat.create(model="m", messages=ask, max_tokens=8, stream=True))
    streamed = [c.choices[0].delta.model_dump().get("reasoning_content") for c in chunks if c.choices]
    assert "".join(piece or "" for piece in streamed) == thought

    messages = anthropic.Anthropic(base_url=url.removesuffix("/v1"), api_key="x", timeout=TIMEOUT_S,
                                   max_retries=0).messages
    message = messages.create(model="m", max_tokens=8, messages=ask, thinking={"type": "adaptive"})
    assert [(b.type, b.thinking) for b in message.content] == [("thinking", thought)]
    with messages.stream(model="m", max_tokens=8, messages=ask) as stream:
        kinds = [e.type for e in stream]
        streamed = stream.get_final_message()
    assert "thinking" in kinds and streamed.content[0].thinking == thought

    responses = openai.OpenAI(base_url=url, api_key="x", timeout=TIMEOUT_S, max_retries=0).responses
    response = responses.create(model="m", input=ask, max_output_tokens=8, reasoning={"summary": "auto"})
    [item] = response.output
    assert item.type == "reasoning" and item.content[0].text == thought
    with responses.stream(model="m", input=ask, max_output_tokens=8) as stream:
        events = list(stream)
    final = events[-1].response  # response.incomplete: the budget ran out
    assert "response.reasoning_text.delta" in [e.type for e in events] and final.output[0].content[0].text == thought


def reasoning_of(path: str, answer: dict) -> str:
    """The reasoning in a whole answer of the API at ``path``."""
    if path == "/chat/completions":
        return answer["choices"][0]["message"].get("reasoning_content") or ""
    if path == "/messages":
        return "".join(b["thinking"] for b in answer["content"] if b["type"] == "thinking")
    return "".join(i["content"][0]["text"] for i in answer["output"] if i["type"] == "reasoning")


@pytest.mark.parametrize("path,switch_off", [
    ("/chat/completions", {"chat_template_kwargs": {"enable_thinking": False}}),
    ("/chat/completions", {"reasoning_effort": "none"}),
    ("/messages", {"thinking": {"type": "disabled"}}),
    ("/responses", {"reasoning": {"effort": "minimal"}}),
])
def test_the_thinking_switch_reaches_the_template(thinking_server, path, switch_off):
    if path == "/responses":
        body = {"model": "m", "max_output_tokens": 6, "input": "hi"}
    else:
        body = {"model": "m", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}
    on = httpx.post(thinking_server.base_url + path, json=body, timeout=TIMEOUT_S).json()
    off = httpx.post(thinking_server.base_url + path, json={**body, **switch_off}, timeout=TIMEOUT_S).json()
    # Off, the template closes an empty <think> in the prompt: a longer prompt, and no reasoning in the answer.
    assert off["timings"]["cache_n"] + off["timings"]["prompt_n"] > on["timings"]["cache_n"] + on["timings"]["prompt_n"]
    assert reasoning_of(path, on) and not reasoning_of(path, off)


def test_a_template_without_thinking_ignores_the_switch(tools_server):
    url = tools_server.base_url + "/chat/completions"
    body = {"model": "m", "max_tokens": 6, "messages": [{"role": "user", "content": "hi"}]}
    plain = httpx.post(url, json=body, timeout=TIMEOUT_S).json()
    switched = httpx.post(url, json={**body, "reasoning_effort": "high"}, timeout=TIMEOUT_S).json()
    assert switched["choices"] == plain["choices"] and "reasoning_content" not in plain["choices"][0]["message"]


@pytest.fixture(scope="module")
def tools_server(make_tiny_model):
    with serving_template(make_tiny_model, "tools", QWEN_TOOLS_TEMPLATE) as server:
        yield server

