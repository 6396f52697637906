"""Code completion in ``serve``: llama-server's /infill and /v1/completions with a ``suffix``.

The prompt is checked token for token against llama-server's layout (``format_prompt_infill`` in the pinned
llama.cpp), written out by hand here on tiny models with FIM tokens, and on the real Qwen2.5-Coder target
against the prompt stock llama-server itself evaluates (its saved slot lists those tokens). Requests take the
shapes llama.vim sends (FACTS.md, "Editors").
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from localspec.engine.decoding.sampling import InfillRule, SamplingParams, probabilities
from localspec.engine.llama.model import Model
from localspec.fim import Chunk, CompletionLimits, FimRequest, fim_prompt
from localspec.prompt_cache import PromptCache
from localspec.server.infill import parse_infill_request
from localspec.server.worker import GenerationWorker
from localspec.session import ModelOptions, Pair, open_decoder
from scripts.bench import agents
from scripts.bench.agents import free_port
from scripts.bench.agents import server as stock_server
from tests.test_bench_stock import stock_bin  # noqa: F401 (a fixture)
from tests.test_server import REAL_TIMEOUT_S, TIMEOUT_S, client, serving, wait_until_idle
from tests.tiny_models import fim_fields

EDITOR_SESSIONS = Path(__file__).parent / "data" / "editor-sessions"
N_CTX = 2048  # llama-server gives the chunks what a batch (1024) leaves of the context
PREFIX = "def hello(x):\n    return x\n\n"
MIDDLE = "def wor"
SUFFIX = "ld(x):\n    print x\n"
CHUNKS = [{"filename": "a.py", "text": "the code print x = x + world\n"}, {"text": "return hello world\n"}]
# llama.vim's requests (autoload/llama.vim): the warm-up whenever its ring of chunks changes, and a completion
# with the fields it asks back for.
WARM_UP = {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": CHUNKS, "prompt": "", "n_predict": 0,
           "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 1,
           "t_max_predict_ms": 1, "response_fields": [""]}
LLAMA_VIM_FIELDS = ["content", "timings/prompt_n", "timings/prompt_ms", "timings/prompt_per_token_ms",
                    "timings/prompt_per_second", "timings/predicted_n", "timings/predicted_ms",
                    "timings/predicted_per_token_ms", "timings/predicted_per_second", "truncated", "tokens_cached"]
COMPLETION = {"id_slot": 0, "input_prefix": PREFIX, "input_suffix": SUFFIX, "input_extra": CHUNKS, "prompt": MIDDLE,
              "n_predict": 32, "stop": [], "n_indent": 0, "top_k": 40, "top_p": 0.90,
              "samplers": ["top_k", "top_p", "infill"], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 500,
              "t_max_predict_ms": 1000, "response_fields": LLAMA_VIM_FIELDS}
# The same completion with a chain that is greedy in llama-server too: a zero temperature before infill.
GREEDY = {**COMPLETION, "samplers": ["top_k", "top_p", "temperature", "infill"], "temperature": 0.0}


@pytest.fixture(scope="module")
def fim_pair(make_tiny_model) -> tuple[Path, Path]:
    return (make_tiny_model("fim-target", seed=0, logit_scale=8.0, **fim_fields()),
            make_tiny_model("fim-draft", seed=0, logit_scale=8.0, perturb_seed=1, perturb_scale=0.5, **fim_fields()))


def open_worker(target: Path, draft: Path | None, *, method: str = "auto",
                prompt_cache: PromptCache | None = None, n_ctx: int = N_CTX) -> GenerationWorker:
    decoder = open_decoder(Pair(target, draft, target.name), ModelOptions(n_ctx=n_ctx, threads=1), method=method)
    return GenerationWorker(decoder, SamplingParams(temperature=0.0), prompt_cache=prompt_cache)


@pytest.fixture(scope="module")
def fim_server(fim_pair):
    with serving(open_worker(*fim_pair, prompt_cache=PromptCache(None, ram_bytes=2**26, disk_bytes=0))) as server:
        yield server


def infill(server, body: dict) -> httpx.Response:
    return httpx.post(server.base_url.removesuffix("/v1") + "/infill", json=body, timeout=TIMEOUT_S)


def tokens(model: Model, text: str) -> list[int]:
    """llama-server's tokenization of the files' text: no BOS, special tokens' texts kept as text."""
    return model.tokenize(text, add_bos=False, special=False)


# -- the prompt --------------------------------------------------------------------------------------
def test_repo_level_prompt_is_llama_servers_layout(fim_pair):
    model = Model(fim_pair[0], vocab_only=True)
    fim, bos = model.fim_tokens(), [model.bos_id] if model.add_bos else []
    # A FIM token's text in a file stays text; in the middle (llama-server's "prompt") it is the token.
    request = FimRequest(PREFIX + "<|fim_prefix|>", SUFFIX, "<|fim_pad|>", tuple(Chunk(**c) for c in CHUNKS))
    [pad] = model.tokenize("<|fim_pad|>", add_bos=False, special=True)
    assert fim_prompt(model, request, n_ctx=N_CTX) == [
        fim["rep"], *tokens(model, "myproject\n"),
        fim["sep"], *tokens(model, "a.py\n"), *tokens(model, CHUNKS[0]["text"]),
        fim["sep"], *tokens(model, "tmp\n"), *tokens(model, CHUNKS[1]["text"]),
        fim["sep"], *tokens(model, "filename\n"),
        *bos, fim["pre"], *tokens(model, request.prefix), pad, fim["suf"], *tokens(model, SUFFIX), fim["mid"]]


def test_plain_fim_prompt_without_repo_tokens(make_tiny_model):
    model = Model(make_tiny_model("fim-plain", **fim_fields(repo_level=False)), vocab_only=True)
    fim, bos = model.fim_tokens(), [model.bos_id] if model.add_bos else []
    assert fim["rep"] is None and fim["sep"] is None
    plain = FimRequest(PREFIX, SUFFIX, MIDDLE)
    assert fim_prompt(model, plain, n_ctx=N_CTX) == [
        *bos, fim["pre"], *tokens(model, PREFIX), *tokens(model, MIDDLE), fim["suf"], *tokens(model, SUFFIX),
        fim["mid"]]
    # Chunks follow a "--- snippet ---" line each, with no names.
    with_chunks = FimRequest(PREFIX, SUFFIX, MIDDLE, (Chunk("x = 1\n", "a.py"),))
    assert fim_prompt(model, with_chunks, n_ctx=N_CTX) == [
        *tokens(model, "\n\n--- snippet ---\n\n"), *tokens(model, "x = 1\n"), *fim_prompt(model, plain, n_ctx=N_CTX)]


def test_budgets_keep_the_text_nearest_the_cursor_and_the_latest_chunks(fim_pair):
    model = Model(fim_pair[0], vocab_only=True)
    fim = model.fim_tokens()
    prefix, suffix, chunk = "hello world " * 40, "print x " * 40, "the code " * 40
    prompt = fim_prompt(model, FimRequest(prefix, suffix, MIDDLE, (Chunk(chunk),)), n_ctx=300, n_batch=128)
    # The prefix gets 3/4 of the batch; the suffix the last quarter less the middle and two FIM tokens; the
    # chunks what the context leaves after a batch and twice the server's answer limit (-1: none).
    extra = [fim["rep"], *tokens(model, "myproject\n"), fim["sep"], *tokens(model, "tmp\n"), *tokens(model, chunk),
             fim["sep"], *tokens(model, "filename\n")]
    middle = tokens(model, MIDDLE)
    assert prompt == [*extra[-(300 - 128 + 2):], model.bos_id, fim["pre"], *tokens(model, prefix)[-96:], *middle,
                      fim["suf"], *tokens(model, suffix)[:32 - 2 - len(middle)], fim["mid"]]


def test_fim_tokens_are_found_by_their_text_without_the_gguf_keys(fim_pair, make_tiny_model):
    by_text = Model(make_tiny_model("fim-by-text", **fim_fields(keys=False)), vocab_only=True)
    assert by_text.fim_tokens() == Model(fim_pair[0], vocab_only=True).fim_tokens()


def test_a_model_without_fim_tokens_gets_a_400_naming_them(tiny_target):
    with serving(open_worker(tiny_target, None)) as server:
        answer = infill(server, COMPLETION | {"samplers": []})
        completion = httpx.post(server.base_url + "/completions", json={"prompt": "x", "suffix": "y"})
    assert answer.status_code == completion.status_code == 400
    message = answer.json()["error"]["message"]
    assert "FIM prefix, suffix, middle token" in message and "tokenizer.ggml.fim_mid_token_id" in message
    assert completion.json()["error"]["message"] == message


# -- requests and answers ----------------------------------------------------------------------------
def test_warm_up_answers_at_once_and_leaves_the_chunks_in_the_prompt_cache(fim_server, fim_pair):
    started = time.monotonic()
    warm = infill(fim_server, WARM_UP)
    assert warm.status_code == 200 and warm.json() == {}  # response_fields [""] names nothing
    assert time.monotonic() - started < 5
    model = Model(fim_pair[0], vocab_only=True)
    warm_prompt = fim_prompt(model, parse_infill_request(WARM_UP).fim, n_ctx=N_CTX)
    wait_until_idle(fim_server)  # the state is kept once the answer is out
    assert (len(warm_prompt), True, False) in fim_server.worker.prompt_cache.entries(fim_server.worker.decoder.target)
    # The next completion finds the chunks (all the warm-up's prompt before the cursor's part).
    chunks = warm_prompt.index(model.fim_tokens()["pre"])
    answer = infill(fim_server, GREEDY | {"response_fields": []}).json()
    assert answer["timings"]["cache_n"] >= chunks


def test_llama_vims_completion_gets_exactly_the_fields_it_asks_for(fim_server):
    answer = infill(fim_server, GREEDY)
    assert answer.status_code == 200
    body = answer.json()
    assert list(body) == LLAMA_VIM_FIELDS
    assert isinstance(body["content"], str) and body["truncated"] is False
    assert body["timings/predicted_n"] > 0 and body["tokens_cached"] > body["timings/prompt_n"] >= 0


def test_llama_vims_own_chain_samples_from_the_infill_samplers_distribution(make_tiny_model):
    """llama.vim samples (top-k 40, top-p 0.9, infill, at temperature 1): every first token drawn is one the
    infill sampler keeps, though top-p alone keeps more."""
    spread = make_tiny_model("fim-spread", seed=5, logit_scale=2.0, **fim_fields())
    model = Model(spread, n_ctx=N_CTX, n_threads=1)
    logits = model.eval(fim_prompt(model, parse_infill_request(COMPLETION).fim, n_ctx=N_CTX))[0]
    plain = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, min_p=0.0)
    kept = {model.detokenize([int(t)]) for t in np.flatnonzero(probabilities(logits, replace(plain, infill=InfillRule(model))))}
    assert len(np.flatnonzero(probabilities(logits, plain))) > len(kept)
    drawn = set()
    with serving(open_worker(spread, None, method="lookup")) as server:
        for seed in range(12):
            answer = infill(server, COMPLETION | {"n_predict": 1, "seed": seed, "response_fields": ["content"]})
            assert answer.status_code == 200
            drawn.add(answer.json()["content"])
    assert drawn <= kept


def test_llama_vscodes_three_completions_come_as_a_list_the_later_ones_drafted_from_the_first(fim_pair):
    with serving(open_worker(*fim_pair)) as server:  # a fresh answer history
        answers = infill(server, GREEDY | {"n_cmpl": 3, "response_fields": []}).json()
        assert [a["index"] for a in answers] == [0, 1, 2]
        assert len({a["content"] for a in answers}) == 1 and answers[0]["content"]
        assert all(a["timings"]["draft_n_accepted"] > 0 for a in answers[1:])
        too_many = infill(server, COMPLETION | {"n_cmpl": 5}).json()["error"]["message"]
        assert too_many == "Field 'n_cmpl': Value must be between 1 <= value <= 4, but got 5"  # llama.vscode's hint
        assert infill(server, COMPLETION | {"n_cmpl": 2, "stream": True}).status_code == 400


def test_chains_localspec_cannot_follow_and_bad_input_get_a_400_naming_them(fim_server):
    tempered_first = infill(fim_server, COMPLETION | {"samplers": ["temperature", "infill"], "temperature": 0.7})
    assert tempered_first.status_code == 400 and "before 'infill'" in tempered_first.json()["error"]["message"]
    assert infill(fim_server, COMPLETION | {"samplers": ["infill", "top_k"]}).status_code == 400
    assert infill(fim_server, COMPLETION | {"input_extra": "a.py"}).status_code == 400
    assert "input_prefix" in infill(fim_server, {"input_suffix": ""}).json()["error"]["message"]


def test_greedy_completion_equals_the_target_alone(fim_server, fim_pair):
    body = GREEDY | {"response_fields": [], "t_max_predict_ms": 0}
    ours = infill(fim_server, body).json()
    with serving(open_worker(fim_pair[0], None, method="none")) as alone:
        expected = infill(alone, body).json()
        # OpenAI's suffix gives the same FIM prompt, without other files' chunks.
        plain = infill(alone, body | {"input_prefix": PREFIX + MIDDLE, "prompt": "", "input_extra": []}).json()
    assert ours["content"] == expected["content"] and ours["tokens_predicted"] == expected["tokens_predicted"] > 0
    completion = client(fim_server).completions.create(model="tiny", prompt=PREFIX + MIDDLE, suffix=SUFFIX,
                                                       max_tokens=32, temperature=0)
    assert completion.choices[0].text == plain["content"]


# -- the editor's limits ------------------------------------------------------------------------------
# Rules that make a tiny model answer lines " x", "  x", "  x"... after the FIM middle token.
LINES = {"<|fim_middle|>": "▁x", "▁x": "<0x0A>", "<0x0A>": "▁", "▁": "▁x"}
UNLIMITED = GREEDY | {"response_fields": [], "t_max_predict_ms": 0, "n_predict": 64}


@pytest.fixture(scope="module")
def lines_server(make_tiny_model):
    """The target alone (a token a round, each timed apart) on a model that writes LINES."""
    target = make_tiny_model("fim-lines", trunk_scale=0.0, next_tokens=LINES, **fim_fields())
    with serving(open_worker(target, None, method="none")) as server:
        yield server


def test_n_indent_ends_the_answer_before_a_less_indented_line(lines_server):
    assert infill(lines_server, UNLIMITED).json()["content"] == " x" + "\n  x" * 21
    # The first line is the cursor line's rest; the next is indented 2.
    assert infill(lines_server, UNLIMITED | {"n_indent": 2}).json()["content"] == " x" + "\n  x" * 21
    cut = infill(lines_server, UNLIMITED | {"n_indent": 3}).json()
    assert cut["content"] == " x\n  " and cut["stop_type"] == "limit"


def test_time_budget_ends_the_answer_at_a_newline(lines_server):
    answer = infill(lines_server, UNLIMITED | {"t_max_predict_ms": 1}).json()
    assert answer["stop_type"] == "limit" and answer["tokens_predicted"] < 64
    assert answer["content"].endswith("\n") and (" x" + "\n  x" * 21).startswith(answer["content"])


def hang_up_after(server, body: dict, seconds: float) -> None:
    """What an editor does on the next keystroke: send a completion, then close the socket mid-answer."""
    host, port = server.base_url.removeprefix("http://").removesuffix("/v1").split(":")
    payload = json.dumps(body).encode()
    with socket.create_connection((host, int(port))) as connection:
        connection.sendall(b"POST /infill HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n%s" % (host.encode(), len(payload), payload))
        time.sleep(seconds)


def test_a_hang_up_frees_the_server_at_once_and_dead_requests_never_hold_up_the_next(make_tiny_model):
    # A model slow enough that its whole answer (till the context is full) takes seconds.
    target = make_tiny_model("fim-lines-slow", trunk_scale=0.0, next_tokens=LINES, n_layers=6, n_embd=384,
                             n_ff=1536, **fim_fields())
    endless = UNLIMITED | {"n_predict": -1}
    short = UNLIMITED | {"n_predict": 16}
    worker = open_worker(target, None, method="none")
    with serving(worker) as server:
        started = time.monotonic()
        first = infill(server, short).json()
        first_s = time.monotonic() - started
        hang_up_after(server, endless, 0.5)
        closed = time.monotonic()
        wait_until_idle(server)
        freed_s = time.monotonic() - closed
        stats = worker.decoder.stats
        assert stats.stop_reason is None and 0 < stats.generated_tokens < (N_CTX - stats.prompt_tokens) // 2
        # Freed within a round or two (a round here is a few ms), not at the end of the answer.
        per_round = stats.decode_s / max(stats.target_passes, 1)
        assert freed_s < 0.25 + 2 * per_round, (freed_s, per_round)
        # 20 keystrokes, each abandoning the request before: nothing of them is left to wait behind.
        for _ in range(20):
            hang_up_after(server, endless, 0.02)
        started = time.monotonic()
        after = infill(server, short).json()
        after_s = time.monotonic() - started
    assert after["content"] == first["content"]
    assert after_s < 1.5 * first_s + 0.25, (after_s, first_s)


@pytest.mark.parametrize("client", ["llama-vim", "llama-vscode"])
def test_a_recorded_editing_session_gets_what_the_plugin_asks_for_prefilling_only_what_changed(make_tiny_model,
                                                                                               client):
    """The real plugin's requests (llama.vim recorded headless; llama.vscode's shapes from its source), in order:
    warm-ups, completions, the ones it abandoned hung up on again."""
    n_ctx = 16384
    target = make_tiny_model("fim-long", seed=0, logit_scale=8.0, n_ctx=n_ctx, **fim_fields())
    requests = agents.read_session(EDITOR_SESSIONS / f"{client}.jsonl")
    news = agents.new_tokens(agents.prompt_tokens(requests, target, n_ctx))
    worker = open_worker(target, None, n_ctx=n_ctx, prompt_cache=PromptCache(None, ram_bytes=2**28, disk_bytes=0))
    checked = 0
    with serving(worker) as server:
        for request, new in zip(requests, news):
            if request.cancelled:
                hang_up_after(server, request.body, 0.02)
                continue
            answer = infill(server, request.body)
            assert answer.status_code == 200, answer.text
            body = answer.json()
            answers = body if isinstance(body, list) else [body]
            assert len(answers) == request.body.get("n_cmpl", 1)
            for one in answers:
                if "response_fields" in request.body:  # llama.vim's warm-up asks for [""]: nothing
                    assert list(one) == [f for f in request.body["response_fields"] if f]
                else:
                    assert {"content", "timings", "tokens_cached", "truncated"} <= one.keys()
            timings = answers[0].get("timings") or {"prompt_n": answers[0].get("timings/prompt_n")}
            prefilled = timings["prompt_n"] if timings["prompt_n"] is not None else worker.decoder.stats.prefill_tokens
            assert prefilled <= new + agents.PREFILL_SLACK, (prefilled, new)
            checked += request.body.get("n_predict", -1) != 0
    assert checked >= 10  # completions, not only warm-ups


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_time_budget_ends_at_the_first_newline_after_it():
    clock = Clock()
    limits = CompletionLimits(t_max_predict_ms=100, clock=clock)
    assert not limits.feed("def f():")
    clock.now = 0.05
    assert not limits.feed("\n    return")  # a newline inside the budget
    clock.now = 0.2
    assert not limits.feed(" 1")  # past the budget, but mid-line
    assert limits.feed("\n")
    assert limits.text == "def f():\n    return 1\n"


def test_n_indent_cuts_a_less_indented_line_one_piece_late():
    limits = CompletionLimits(n_indent=4)
    pieces = ["x = 1\n", "    y = 2\n", "z", " = 3"]
    # The line after the first newline is checked from the next piece on, each line one piece after the last.
    assert [limits.feed(p) for p in pieces] == [False, False, False, True]
    assert limits.text == "x = 1\n    y = 2\n"


# -- against stock llama-server on the real target ----------------------------------------------------
# A small context and batch, and a server answer limit, so that each of llama-server's budgets cuts something
# within a few hundred tokens (cheap to prefill on two cores).
STOCK_CTX, STOCK_BATCH, STOCK_PREDICT = 512, 256, 8


def editor_requests() -> list[dict]:
    """llama.vim's requests at a few cursor positions in this file, with chunks of another (its budgets: 256
    lines before the cursor line, 64 after); this file holds FIM tokens' texts, which must stay text."""
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    other = (Path(__file__).parents[1] / "localspec" / "fim.py").read_text(encoding="utf-8").splitlines()
    chunks = [{"filename": "localspec/fim.py", "text": "\n".join(other[i:i + 32]) + "\n"} for i in (0, 40)]
    requests = []
    for row in (12, 75, 140):
        line = lines[row]
        column = len(line) // 2
        requests.append({"input_prefix": "\n".join(lines[max(0, row - 256):row]) + "\n", "prompt": line[:column],
                         "input_suffix": line[column:] + "\n" + "\n".join(lines[row + 1:row + 65]) + "\n",
                         "input_extra": chunks, "n_predict": 0, "samplers": [], "cache_prompt": True})
    return requests


def recorded_requests() -> list[dict]:
    """Two of llama.vim's own recorded completions, the ones with the most text around the cursor and in chunks,
    asked for their prompt only (and for the whole answer, which says how many tokens the prompt had)."""
    completions = [r.body for r in agents.read_session(EDITOR_SESSIONS / "llama-vim.jsonl")
                   if r.body.get("n_predict") != 0]
    biggest = sorted(completions, key=lambda b: len(json.dumps(b)))[-2:]
    return [{**{k: v for k, v in body.items() if k != "response_fields"}, "n_predict": 0} for body in biggest]


def saved_slot_tokens(path: Path) -> list[int]:
    """The tokens llama-server evaluated for a slot, from its saved state."""
    data = path.read_bytes()
    magic, _, count = struct.unpack_from("<3I", data)  # llama_state_seq_save_file's header
    assert magic == 0x67677371  # "ggsq"
    packed = struct.unpack_from(f"<{count}i", data, 12)
    # llama-server's own list: a -1 marker, its version, the number of tokens, the tokens (then media).
    return list(packed[3:3 + packed[2]]) if packed[0] == -1 else list(packed)


@pytest.mark.real
@pytest.mark.stock
@pytest.mark.timeout(300)
def test_prompts_equal_stock_llama_servers_on_the_real_target(qwen_pair, stock_bin, tmp_path):  # noqa: F811
    target = qwen_pair[0]
    model = Model(target, vocab_only=True)
    port = free_port()
    command = [str(stock_bin / "llama-server"), "-m", str(target), "-c", str(STOCK_CTX), "-b", str(STOCK_BATCH),
               "-ub", str(STOCK_BATCH), "-n", str(STOCK_PREDICT), "-np", "1", "-t", "2", "--no-warmup",
               "--host", "127.0.0.1", "--port", str(port), "--slot-save-path", str(tmp_path)]
    with stock_server(command, port, dict(os.environ), tmp_path / "llama-server.log") as base:
        for i, body in enumerate(editor_requests() + recorded_requests()):
            answer = httpx.post(f"{base}/infill", json=body, timeout=REAL_TIMEOUT_S)
            assert answer.status_code == 200, answer.text
            saved = httpx.post(f"{base}/slots/0?action=save", json={"filename": f"{i}.bin"}, timeout=TIMEOUT_S)
            assert saved.status_code == 200, saved.text
            theirs = saved_slot_tokens(tmp_path / f"{i}.bin")
            ours = fim_prompt(model, parse_infill_request(body).fim, n_ctx=STOCK_CTX, n_batch=STOCK_BATCH,
                              n_predict=STOCK_PREDICT)
            assert ours == theirs and answer.json()["tokens_evaluated"] == len(ours)
