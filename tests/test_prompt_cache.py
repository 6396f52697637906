"""The prompt cache across conversations (localspec/prompt_cache.py), on tiny generated models.

Model-level tests restore states into real llama.cpp contexts and compare logits bit for bit with a model
that prefilled the same tokens the way the cached request did; server tests drive a running server with
the official openai and anthropic clients and compare answers with cold servers (one request each) and
a server without the cache; the benchmark script's replay and recorder are tested here too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import struct
import subprocess
import sys
import time
from contextlib import ExitStack, nullcontext
from pathlib import Path

import anthropic
import numpy as np
import openai
import pytest

from localspec import paths
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.llama.model import Model
from localspec.gguf.memory import MemoryKind
from localspec.prompt_cache import SUFFIX, PromptCache, usable_prefix
from localspec.server.worker import GenerationWorker
from localspec.session import ModelOptions, Pair, open_decoder
from scripts.bench import agents as bench
from tests.test_bench_stock import stock_bin  # noqa: F401 (a fixture)
from tests.test_server import TIMEOUT_S, serving

N_CTX = 512
SYSTEM = "You answer in code. hello world the code print x = 1"
TEXTS = ["hello world the code print x", "the code print hello world", "print x = hello the world code",
         "world hello x print code the", "code the world hello print x ="]
BIG = 2**30


def load(path, *, n_ctx: int = N_CTX, **options) -> Model:
    return Model(path, n_ctx=n_ctx, n_threads=1, **options)


def tokens_of(model: Model, text: str) -> list[int]:
    return model.tokenize(f"{SYSTEM}\n{text}", add_bos=True)


def prefill(model: Model, prompt: list[int]) -> np.ndarray:
    """The last logits of ``prompt``, reusing what the model holds, as SpeculativeDecoder.generate does."""
    keep = min(model.common_prefix(prompt), len(prompt) - 1)
    model.rollback(keep)
    return model.eval(prompt[keep:], n_logits=1, prefill=True)[0]


def memory_cache(**bounds) -> PromptCache:
    return PromptCache(None, **{"ram_bytes": BIG, "disk_bytes": 0, **bounds})


def disk_cache(**bounds) -> PromptCache:
    return PromptCache(paths.prompt_cache_dir(), **{"ram_bytes": 0, "disk_bytes": BIG, **bounds})


def state_files() -> list:
    return sorted(paths.prompt_cache_dir().glob(f"*{SUFFIX}"))


# -- which state counts ------------------------------------------------------------------------------
def test_usable_prefix_leaves_the_last_token_to_evaluate_and_never_cuts_a_recurrent_state():
    prompt = [1, 2, 3, 4, 5]
    assert usable_prefix([1, 2, 9], prompt, exact=False) == 2  # a KV cache is cut after the common part
    assert usable_prefix([1, 2, 3, 4, 5, 6], prompt, exact=False) == 4  # the last token gives the logits
    assert usable_prefix([1, 2, 9], prompt, exact=True) == 0  # it would need cutting
    assert usable_prefix([1, 2, 3], prompt, exact=True) == 3
    assert usable_prefix([1, 2, 3, 4, 5], prompt, exact=True) == 0  # nothing left to evaluate after it
    assert usable_prefix([], prompt, exact=True) == 0


def test_the_longest_prefix_is_restored_and_continues_exactly_as_its_original_state(tiny_target):
    model, cache = load(tiny_target), memory_cache()
    first, second = tokens_of(model, TEXTS[0]), tokens_of(model, TEXTS[1])
    prefill(model, first)
    cache.keep(model)
    prefill(model, second)
    cache.keep(model)

    follow_up = first + model.tokenize(" and then more", add_bos=False)
    restored = cache.restore(model, follow_up)
    assert restored is not None and restored.tokens == len(first) and restored.source == "memory"
    assert model.tokens == first
    logits = prefill(model, follow_up)

    original = load(tiny_target)  # the path the first request's state took, with nothing cached
    prefill(original, first)
    assert np.array_equal(logits, prefill(original, follow_up))

    # The state that shares the most wins, even when it holds tokens the prompt does not.
    near_second = second[:-2] + model.tokenize("xx", add_bos=False)
    assert cache.restore(model, near_second).tokens == len(second) - 2
    assert model.tokens == second
    # Nothing is restored when the model already holds the best prefix.
    assert cache.restore(model, near_second) is None


def test_memory_never_grows_past_its_bound_and_drops_the_least_recently_used(tiny_target):
    model = load(tiny_target)
    prompts = [tokens_of(model, text) for text in TEXTS]
    prefill(model, prompts[0])
    one = len(model.save_prompt_state())
    cache = memory_cache(ram_bytes=int(2.5 * one))
    for prompt in prompts[:3]:
        prefill(model, prompt)
        cache.keep(model)
        assert cache.ram_used <= cache.ram_bytes
    assert [n for n, _, _ in cache.entries(model)] == [len(prompts[1]), len(prompts[2])]

    assert cache.restore(model, prompts[1] + [5]) is not None  # prompts[1] is now the most recently used
    prefill(model, prompts[3])
    cache.keep(model)
    assert cache.ram_used <= cache.ram_bytes
    held = [n for n, _, _ in cache.entries(model)]
    assert held == [len(prompts[1]), len(prompts[3])]
    assert cache.restore(model, prompts[2] + [5]) is None  # dropped


def test_a_state_larger_than_both_bounds_is_not_kept(tiny_target):
    model = load(tiny_target)
    prefill(model, tokens_of(model, TEXTS[0]))
    cache = PromptCache(paths.prompt_cache_dir(), ram_bytes=100, disk_bytes=100)
    cache.keep(model)
    assert cache.entries(model) == [] and cache.ram_used == 0 and state_files() == []


def test_a_kv_state_covering_a_kept_prefix_replaces_it(tiny_target):
    model, cache = load(tiny_target), disk_cache(ram_bytes=BIG)
    turn = tokens_of(model, TEXTS[0])
    prefill(model, turn)
    cache.keep(model)
    prefill(model, turn + model.tokenize(" next turn", add_bos=False))
    cache.keep(model)
    assert [n for n, _, _ in cache.entries(model)] == [len(model.tokens)]
    assert len(state_files()) == 1


# -- disk --------------------------------------------------------------------------------------------
def test_disk_round_trip_gives_a_new_model_the_original_state(tiny_target):
    model = load(tiny_target)
    prompt = tokens_of(model, TEXTS[0])
    prefill(model, prompt)
    disk_cache().keep(model)
    [file] = state_files()
    assert file.stat().st_mode & 0o777 == 0o600

    restarted, cache = load(tiny_target), disk_cache(ram_bytes=BIG)
    follow_up = prompt + restarted.tokenize(" more", add_bos=False)
    restored = cache.restore(restarted, follow_up)
    assert restored is not None and restored.source == "disk" and restored.tokens == len(prompt)
    assert np.array_equal(prefill(restarted, follow_up), prefill(model, follow_up))
    assert cache.entries(restarted)[0][1]  # now held in memory too


def test_a_damaged_file_is_ignored_deleted_and_replaced(tiny_target):
    model = load(tiny_target)
    prompt = tokens_of(model, TEXTS[0])
    prefill(model, prompt)
    disk_cache().keep(model)
    [file] = state_files()
    data = bytearray(file.read_bytes())
    data[-100] ^= 0xFF  # one flipped bit pattern deep in the state: only the checksum can tell
    file.write_bytes(bytes(data))

    fresh = load(tiny_target)
    cache = disk_cache()
    assert cache.restore(fresh, prompt + [5]) is None and fresh.tokens == []
    assert not file.exists()
    prefill(fresh, prompt)
    cache.keep(fresh)
    assert disk_cache().restore(load(tiny_target), prompt + [5]).source == "disk"

    [file] = state_files()
    file.write_bytes(file.read_bytes()[:-1])  # truncated: its sizes no longer add up
    assert disk_cache().restore(load(tiny_target), prompt + [5]) is None
    assert state_files() == []


def test_a_foreign_file_is_never_used_and_is_replaced(tiny_target):
    model = load(tiny_target)
    prompt = tokens_of(model, TEXTS[0])
    prefill(model, prompt)
    disk_cache().keep(model)
    [foreign] = state_files()

    other = load(tiny_target, n_ctx=N_CTX // 2)  # another context layout: another identity
    assert other.state_identity() != model.state_identity()
    cache = disk_cache()
    assert cache.restore(other, prompt + [5]) is None and other.tokens == []
    prefill(other, prompt)
    cache.keep(other)
    [own] = [f for f in state_files() if f != foreign]

    # The foreign state under this model's own file name: still never used, and overwritten by the next keep.
    own.write_bytes(foreign.read_bytes())
    fresh = load(tiny_target, n_ctx=N_CTX // 2)
    cache = disk_cache()
    assert cache.restore(fresh, prompt + [5]) is None and fresh.tokens == []
    prefill(fresh, prompt)
    cache.keep(fresh)
    again = load(tiny_target, n_ctx=N_CTX // 2)
    assert disk_cache().restore(again, prompt + [5]).source == "disk"
    assert np.array_equal(prefill(again, prompt + [5]), prefill(fresh, prompt + [5]))


def test_disk_never_grows_past_its_bound_and_drops_the_oldest_files_first(tiny_target):
    model = load(tiny_target)
    prompts = [tokens_of(model, text) for text in TEXTS]
    foreign = load(tiny_target, n_ctx=N_CTX // 2)
    prefill(foreign, prompts[0])
    disk_cache().keep(foreign)  # another model's file, older than the rest
    one = state_files()[0].stat().st_size
    cache = disk_cache(disk_bytes=int(3.5 * one))
    for prompt in prompts:
        prefill(model, prompt)
        cache.keep(model)
        assert cache.disk_used() <= cache.disk_bytes
    kept = disk_cache(disk_bytes=int(3.5 * one))
    fresh = load(tiny_target)
    assert [n for n, _, on_disk in kept.entries(fresh) if on_disk] == [len(p) for p in prompts[-3:]]
    assert disk_cache().restore(foreign, prompts[0] + [5]) is None  # the oldest file went first


def test_symlinks_are_never_followed_and_stale_temporary_files_go(tiny_target, tmp_path):
    model = load(tiny_target)
    prefill(model, tokens_of(model, TEXTS[0]))
    disk_cache().keep(model)
    [file] = state_files()
    outside = tmp_path / "outside.state"
    outside.write_bytes(file.read_bytes())
    directory = paths.prompt_cache_dir()
    (directory / f"{'0' * 40}{SUFFIX}").symlink_to(outside)
    stale = directory / f".{file.name}.abc.part"
    stale.write_bytes(b"half a state")
    os.utime(stale, (0, 0))
    fresh = disk_cache(disk_bytes=int(1.5 * file.stat().st_size))  # room for one file only
    prefill(model, tokens_of(model, TEXTS[1]))
    fresh.keep(model)
    assert outside.exists() and not stale.exists()
    assert fresh.disk_used() <= fresh.disk_bytes and not file.exists()


# -- recurrent and hybrid models -------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["qwen35", "lfm2", "mamba"])
def test_a_recurrent_state_is_restored_only_where_it_was_saved(make_tiny_model, arch):
    path = make_tiny_model(f"{arch}-cache", architecture=arch, seed=3, logit_scale=8.0)
    model = load(path)
    assert model.memory_plan.memory != MemoryKind.KV
    prompt = tokens_of(model, TEXTS[0])
    prefill(model, prompt)
    cache = disk_cache(ram_bytes=BIG)
    cache.keep(model)
    shorter = prompt[:-3]
    prefill(model, shorter)  # a state of its prefix: kept beside the longer one (it cannot be cut from it)
    cache.keep(model)
    assert sorted(n for n, _, _ in cache.entries(model)) == [len(shorter), len(prompt)]

    fresh = load(path)
    diverging = prompt[:-1] + model.tokenize("zz", add_bos=False)  # shares all but the last token
    assert cache.restore(fresh, diverging).tokens == len(shorter)  # not the longer state: it would need a cut
    assert fresh.tokens == shorter

    restarted = load(path)
    follow_up = prompt + model.tokenize(" more", add_bos=False)
    assert disk_cache().restore(restarted, follow_up).tokens == len(prompt)
    original = load(path)
    prefill(original, prompt)
    assert np.array_equal(prefill(restarted, follow_up), prefill(original, follow_up))


# -- the server ------------------------------------------------------------------------------------------
def open_worker(target, draft, *, cache: PromptCache | None, method: str = "auto") -> GenerationWorker:
    decoder = open_decoder(Pair(target, draft, target.name), ModelOptions(n_ctx=1024, threads=1), method=method)
    return GenerationWorker(decoder, SamplingParams(temperature=0.0), prompt_cache=cache)


def chat(server, history, **options):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=TIMEOUT_S, max_retries=0)
    return client.chat.completions.create(model="tiny", messages=history, max_tokens=24, temperature=0, **options)


def message(server, history, system):
    client = anthropic.Anthropic(base_url=server.base_url.removesuffix("/v1"), api_key="unused", timeout=TIMEOUT_S,
                                 max_retries=0)
    return client.messages.create(model="tiny", system=system, messages=history, max_tokens=24)


def respond(server, history, instructions):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=TIMEOUT_S, max_retries=0)
    return client.responses.create(model="tiny", instructions=instructions, input=history, max_output_tokens=24,
                                   temperature=0)


MAIN = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TEXTS[0]}]
SIDE_SYSTEM = "Give the chat a title."


def interleaved_session(server_for) -> tuple[list[str], list[int], list[int]]:
    """A main conversation whose turns have side requests between them (a title agent on the Anthropic API,
    a Responses client): (answers, prompt tokens, cached tokens) per request. ``server_for()`` gives the
    server each request goes to (a context manager)."""
    answers, prompts, cached = [], [], []
    with server_for() as server:
        first = chat(server, MAIN)
    answers.append(first.choices[0].message.content)
    prompts.append(first.usage.prompt_tokens)
    cached.append(first.usage.prompt_tokens_details.cached_tokens)
    with server_for() as server:
        side = message(server, [{"role": "user", "content": TEXTS[1]}], SIDE_SYSTEM)
    answers.append(side.content[0].text)
    prompts.append(side.usage.input_tokens + side.usage.cache_read_input_tokens)
    cached.append(side.usage.cache_read_input_tokens)
    history = [*MAIN, {"role": "assistant", "content": answers[0]}, {"role": "user", "content": TEXTS[2]}]
    with server_for() as server:
        second = chat(server, history)
    answers.append(second.choices[0].message.content)
    prompts.append(second.usage.prompt_tokens)
    cached.append(second.usage.prompt_tokens_details.cached_tokens)
    assert cached[-1] == second.model_extra["timings"]["cache_n"]
    with server_for() as server:
        other = respond(server, [{"role": "user", "content": TEXTS[3]}], SIDE_SYSTEM)
    answers.append(other.output_text)
    prompts.append(other.usage.input_tokens)
    cached.append(other.usage.input_tokens_details.cached_tokens)
    with server_for() as server:
        side_again = message(server, [{"role": "user", "content": TEXTS[1]},
                                      {"role": "assistant", "content": answers[1]},
                                      {"role": "user", "content": TEXTS[4]}], SIDE_SYSTEM)
    answers.append(side_again.content[0].text)
    prompts.append(side_again.usage.input_tokens + side_again.usage.cache_read_input_tokens)
    cached.append(side_again.usage.cache_read_input_tokens)
    return answers, prompts, cached


def one_server(worker: GenerationWorker):
    """``server_for`` for interleaved_session: every request to one running server."""
    stack = ExitStack()
    server = stack.enter_context(serving(worker))
    return stack, lambda: nullcontext(server)


@pytest.mark.parametrize("method", ["auto", "draft"])
def test_an_interleaved_session_answers_as_cold_servers_do_and_reuses_each_prefix(tiny_target, tiny_draft, method):
    # Each request on a server of its own: nothing reused at all.
    expected, _, cold = interleaved_session(
        lambda: serving(open_worker(tiny_target, tiny_draft, cache=None, method=method)))
    assert not any(cold)
    stack, server_for = one_server(open_worker(tiny_target, tiny_draft, cache=None, method=method))
    with stack:
        single, _, uncached = interleaved_session(server_for)
    cache = PromptCache(paths.prompt_cache_dir(), ram_bytes=BIG, disk_bytes=BIG)
    worker = open_worker(tiny_target, tiny_draft, cache=cache, method=method)
    stack, server_for = one_server(worker)
    with stack:
        answers, prompts, cached = interleaved_session(server_for)
    assert answers == single == expected and all(answers)
    # The side requests broke the single KV cache's reuse; the prompt cache keeps each conversation's
    # whole earlier prompt (the next turn extends it).
    assert uncached[2] < prompts[0] <= cached[2] and uncached[4] < prompts[1] <= cached[4]
    assert cached[3] > uncached[3]  # the Responses request shares the side conversation's system text
    if method == "draft":  # the draft's state was kept too, beside the target's
        assert cache.entries(worker.decoder.draft.model)


def test_a_restarted_server_reuses_the_states_on_disk(tiny_target, tiny_draft):
    def cache() -> PromptCache:
        return PromptCache(paths.prompt_cache_dir(), ram_bytes=BIG, disk_bytes=BIG)

    with serving(open_worker(tiny_target, tiny_draft, cache=cache())) as server:
        first = chat(server, MAIN)
    history = [*MAIN, {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": TEXTS[2]}]
    with serving(open_worker(tiny_target, tiny_draft, cache=None)) as server:
        expected = chat(server, history)
    with serving(open_worker(tiny_target, tiny_draft, cache=cache())) as server:
        again = chat(server, history)
    assert again.choices[0].message.content == expected.choices[0].message.content
    assert expected.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens


def test_a_hybrid_target_restores_the_previous_turns_prompt_between_side_requests(make_tiny_model):
    """A recurrent state is kept at the end of each prompt too: the next turn re-renders the answer, perhaps
    not token for token, but starts with the whole earlier prompt."""
    target = make_tiny_model("qwen35-serve", architecture="qwen35", seed=3, logit_scale=8.0)
    expected, _, _ = interleaved_session(lambda: serving(open_worker(target, None, cache=None)))
    stack, server_for = one_server(open_worker(target, None, cache=memory_cache()))
    with stack:
        answers, prompts, cached = interleaved_session(server_for)
    assert answers == expected and all(answers)
    assert cached[2] >= prompts[0] and cached[4] >= prompts[1]


# -- scripts/bench/agents.py on a recorded-style session -------------------------------------------------------
def test_bench_agents_replay_prefills_only_what_no_earlier_request_shares(tiny_target, tiny_draft, tmp_path):
    agent = "You are an agent. " + "hello world the code print x = 1. " * 8
    main = [{"role": "system", "content": agent}, {"role": "user", "content": TEXTS[0]}]
    lines = [
        {"path": "/v1/chat/completions", "body": {"stream": True, "messages": [
            {"role": "system", "content": SIDE_SYSTEM}, {"role": "user", "content": TEXTS[1]}]}},
        {"path": "/v1/chat/completions", "body": {"stream": True, "messages": main}},
        {"method": "GET", "path": "/v1/models"},  # not replayed
        {"path": "/v1/messages?beta=true", "body": {"stream": True, "system": SIDE_SYSTEM, "max_tokens": 9,
                                                    "messages": [{"role": "user", "content": TEXTS[2]}]}},
        {"path": "/v1/chat/completions", "body": {"messages": [*main, {"role": "assistant", "content": "x = 1"},
                                                               {"role": "user", "content": TEXTS[3]}]}},
        {"path": "/v1/responses", "body": {"stream": True, "instructions": agent, "input": TEXTS[4]}},
    ]
    session = tmp_path / "session.jsonl"
    session.write_text("".join(f"{json.dumps(line)}\n" for line in lines))
    requests = bench.read_session(session)
    assert [r.path for r in requests][2] == "/v1/messages?beta=true" and len(requests) == 5
    prompts = bench.prompt_tokens(requests, tiny_target, 4096)
    news = bench.new_tokens(prompts)
    assert news[0] == len(prompts[0]) and news[3] < len(prompts[3]) - len(prompts[1]) + 10

    cache = PromptCache(paths.prompt_cache_dir(), ram_bytes=BIG, disk_bytes=BIG)
    with serving(open_worker(tiny_target, tiny_draft, cache=cache)) as server:
        options = argparse.Namespace(temperature=0.0, max_tokens=12, lift_budgets=False)
        answers = bench.replay(server.base_url.removesuffix("/v1"), requests, options)
    for prompt, new, answer in zip(prompts, news, answers):
        assert answer.status == 200 and answer.first_token_s is not None
        assert answer.prompt_n + answer.cache_n == len(prompt)  # the script renders what the server prefills
        assert answer.prompt_n <= new + bench.PREFILL_SLACK
    assert answers[3].cache_n >= len(prompts[1])


def test_bench_agents_counts_what_llama_server_prefilled_where_its_stream_carries_no_timings(
        stock_bin, tiny_target, tmp_path):
    """Stock llama-server's Anthropic and Responses streams carry no timings: its counters (/metrics) say
    what each request prefilled and reused."""
    agent = "You are an agent. " + "hello world the code print x = 1. " * 8
    first = {"stream": True, "system": agent, "max_tokens": 6, "messages": [{"role": "user", "content": TEXTS[0]}]}
    later = {**first, "messages": [*first["messages"], {"role": "assistant", "content": "x = 1"},
                                   {"role": "user", "content": TEXTS[1]}]}
    requests = [bench.Request("/v1/messages?beta=true", first), bench.Request("/v1/messages?beta=true", later),
                bench.Request("/v1/responses", {"stream": True, "instructions": agent, "input": TEXTS[2],
                                                "max_output_tokens": 6})]
    args = argparse.Namespace(llama_server=str(stock_bin / "llama-server"), target_path=tiny_target, threads=1,
                              ctx=1024, llama_server_args=[], temperature=0.0, max_tokens=None, lift_budgets=False)
    answers = bench.run_engine("llama-server", tmp_path / "session.jsonl", requests, args, tmp_path).answers
    assert [a.status for a in answers] == [200, 200, 200]
    cold, turn, side = answers
    assert cold.cache_n == 0 and cold.prompt_n > 60 and cold.predicted_n > 0
    assert turn.cache_n >= cold.prompt_n - 8 and 0 < turn.prompt_n < cold.prompt_n // 2
    assert side.prompt_n + side.cache_n > 60 and side.prompt_ms > 0


def test_bench_agents_gives_no_session_verdict_when_an_engine_failed_a_request(capsys):
    """Stock llama-server dropped the connection on a recorded Claude Code request: its short session time
    must not read as a win for either engine."""
    requests = [bench.Request("/v1/messages", {}), bench.Request("/v1/messages", {})]
    ok = bench.Answer(200, 5.0, 1.0, prompt_n=10, cache_n=0)
    ours = bench.Replay("localspec", "s", [ok, ok], seconds=10.0)
    failed = bench.Replay("llama-server", "s", [ok, bench.Answer(0, 0.0, None, error="disconnected")], seconds=5.0)
    verdicts = bench.report("s", requests, [[1] * 10, [1] * 20], [10, 10],
                            {"localspec": ours, "llama-server": failed})["verdicts"]
    assert verdicts["session faster than llama-server"] is False
    assert "not comparable: llama-server failed a request" in capsys.readouterr().out
    both = bench.report("s", requests, [[1] * 10, [1] * 20], [10, 10],
                        {"localspec": ours, "llama-server": bench.Replay("llama-server", "s", [ok, ok], seconds=12.0)})
    assert both["verdicts"]["session faster than llama-server"] is True


def read_request(connection: socket.socket) -> None:
    """Read one HTTP request whole, so that closing the connection after it sends a FIN and not a reset."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += connection.recv(65536)
    head, _, received = data.partition(b"\r\n\r\n")
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    while len(received) < length:
        received += connection.recv(65536)


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
def test_bench_agents_retries_a_connection_the_server_closed_without_answering(reset):
    """As the clients' SDKs do: a connection closed (or reset) before any answer is tried again (its time
    counted); an answer that then comes is the request's answer."""
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    body = b'{"timings": {"prompt_n": 3, "cache_n": 4}}'

    def serve() -> None:
        for attempt in range(2):
            connection, _ = listener.accept()
            with connection:
                read_request(connection)
                if not attempt and reset:  # linger 0: close sends a reset
                    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                if attempt:  # the first connection is closed unanswered
                    connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                       b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    base = "http://127.0.0.1:%d" % listener.getsockname()[1]
    answer, retries = bench.send_as_clients_do(base, bench.Request("/v1/chat/completions", {}), {"stream": False})
    server.join(TIMEOUT_S)
    listener.close()
    assert (answer.status, answer.prompt_n, answer.cache_n, retries) == (200, 3, 4, 1)


def test_bench_agents_record_passes_answers_through_and_writes_each_request(tiny_target, tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "recorded.jsonl"
    with serving(open_worker(tiny_target, None, cache=None)) as server:
        script = Path(__file__).resolve().parent.parent / "scripts" / "bench" / "agents.py"
        proxy = subprocess.Popen([sys.executable, str(script), "record", "--upstream",
                                  server.base_url.removesuffix("/v1"), "--port", str(port), "--out", str(out)],
                                 stderr=subprocess.PIPE)
        try:
            recorder = f"http://127.0.0.1:{port}/v1"
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                try:
                    streamed = openai.OpenAI(base_url=recorder, api_key="unused", max_retries=0).chat.completions.create(
                        model="tiny", messages=MAIN, max_tokens=24, temperature=0, stream=True)
                    break
                except openai.APIConnectionError:
                    assert time.monotonic() < deadline and proxy.poll() is None, "the recorder did not start"
                    time.sleep(0.1)
            text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
            direct = chat(server, MAIN)
        finally:
            proxy.terminate()
            proxy.wait(TIMEOUT_S)
    assert text == direct.choices[0].message.content
    [line] = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["path"] == "/v1/chat/completions" and line["body"]["messages"] == MAIN and line["body"]["stream"]


# -- the real pair ------------------------------------------------------------------------------------------
@pytest.mark.real
def test_real_pair_restored_states_continue_exactly_as_the_kept_kv_cache_would(qwen_pair):
    """On the real pair a cached prefix can differ by rounding from a cold prefill of the whole prompt, so the
    reference is a server without the cache that never had a side request between the turns: a restored
    state is that server's state, so every answer is the same, bit for bit, also after a restart."""
    target, draft = qwen_pair

    def real_worker(cache: PromptCache | None) -> GenerationWorker:
        decoder = open_decoder(Pair(target, draft, target.name), ModelOptions(n_ctx=2048), method="auto")
        return GenerationWorker(decoder, SamplingParams(temperature=0.0), prompt_cache=cache)

    def ask(server, history, max_tokens=24):
        client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=1200, max_retries=0)
        return client.chat.completions.create(model="m", messages=history, max_tokens=max_tokens, temperature=0)

    main = [{"role": "system", "content": "You are a careful Python reviewer. Answer briefly, in plain text."},
            {"role": "user", "content": "What does `sorted(set(xs))` return for xs = [3, 1, 3, 2]?"}]

    def turn(first: str, question: str) -> list[dict]:
        return [*main, {"role": "assistant", "content": first}, {"role": "user", "content": question}]

    disk = lambda: PromptCache(paths.prompt_cache_dir(), ram_bytes=BIG, disk_bytes=BIG)  # noqa: E731
    with serving(real_worker(disk())) as server:
        first = ask(server, main)
        side = ask(server, [{"role": "user", "content": "Give this chat a three-word title."}], max_tokens=8)
        second = ask(server, turn(first.choices[0].message.content, "And for xs = []?"))
    with serving(real_worker(None)) as server:
        expected_first = ask(server, main)
        expected_second = ask(server, turn(expected_first.choices[0].message.content, "And for xs = []?"))
        expected_third = ask(server, turn(expected_first.choices[0].message.content, "Is it a list?"))
    with serving(real_worker(disk())) as server:  # a restarted server: the states come from disk
        third = ask(server, turn(first.choices[0].message.content, "Is it a list?"))
    assert first.choices[0].message.content == expected_first.choices[0].message.content
    assert second.choices[0].message.content == expected_second.choices[0].message.content
    assert third.choices[0].message.content == expected_third.choices[0].message.content
    assert side.usage.prompt_tokens_details.cached_tokens < 10
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert third.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
