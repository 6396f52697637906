"""Recorded agent sessions replayed against `localspec serve` and stock `llama-server`, side by side.

A recording is a JSONL file, one request per line as the client sent it: ``{"path": "/v1/chat/completions",
"body": {...}}`` (other keys, such as ``method`` and ``headers``, are ignored; ``record`` below writes
them). Each engine gets a fresh server on the same model, threads and context (localspec a fresh
LOCALSPEC_HOME, so nothing is cached on disk or learned; llama-server its defaults, prompt cache on), and
the requests are sent one after the other in the recorded order, streamed where the client streamed.

Per request it prints the prompt's tokens, the tokens no earlier request of the session shares with it
("new": the prompt less its longest common prefix with any earlier prompt, as localspec renders them),
the tokens each engine prefilled (``timings.prompt_n``), time to first token, the request's time and
decode tok/s. Then the session's time per engine, and the restarted case: localspec serve stopped and
started again on the same LOCALSPEC_HOME and the session's first request sent again, its time to first
token against that request's cold prefill. The checks of issue 29 are printed as PASS/FAIL: every
request prefills at most new + 64 tokens; the session takes less time on localspec than on llama-server;
the restarted first request takes at most 10% of its cold prefill time.

    .venv/bin/python -m scripts.bench.agents replay tests/data/agent-sessions/*.jsonl \\
        [--profile NAME | --target T.gguf [--draft D.gguf]] [--llama-server PATH] [--threads 2] [--ctx 16384] \\
        [--engines localspec,llama-server] [--temperature 0] [--max-tokens N] [--json OUT.json]
    .venv/bin/python -m scripts.bench.agents record --upstream http://127.0.0.1:8080 --port 8090 --out S.jsonl

``record`` is a pass-through proxy: point the agent at --port, the server it should talk to at --upstream.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median

import httpx

REPO = Path(__file__).resolve().parents[2]
GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses", "/infill")
# Answer-length fields per API, for --max-tokens.
MAX_TOKEN_FIELDS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"), "/v1/completions": ("max_tokens",),
                    "/v1/messages": ("max_tokens",), "/v1/responses": ("max_output_tokens",), "/infill": ("n_predict",)}
PARSERS = {"/v1/chat/completions": "parse_chat_request", "/v1/completions": "parse_completion_request",
           "/v1/messages": "parse_messages_request", "/v1/responses": "parse_responses_request",
           "/infill": "parse_infill_request"}
PREFILL_SLACK = 64  # issue 29: a request may prefill this much more than what no earlier request shares
RESTART_SHARE = 0.10  # ... and a restarted server's first request takes at most this share of its cold prefill
# Issue 46, editor sessions: with the plugins' time budgets, at least this many times stock's suggested tokens
# (median per request), never fewer lines; with the budgets lifted, the whole suggestion in at most this share
# of stock's time (median per request).
SUGGESTED_TOKENS_RATIO = 1.4
SUGGESTION_TIME_SHARE = 0.7
START_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 3600
HANG_UP_S = 0.5  # how long a replayed client waits before abandoning a request it abandoned when recorded
HUNG_UP = 499  # the status an abandoned request is reported with (nginx's "client closed request")
CONNECTION_RETRIES = 2  # what the OpenAI and Anthropic SDKs retry a connection error by default


@dataclass
class Request:
    path: str
    body: dict
    cancelled: bool = False  # the client hung up before the answer was complete (an editor dropping it, quitting)


@dataclass
class Answer:
    status: int
    seconds: float
    first_token_s: float | None
    prompt_n: int | None = None  # tokens prefilled (timings)
    cache_n: int | None = None  # tokens reused (timings)
    prompt_ms: float | None = None
    predicted_n: int | None = None
    predicted_per_second: float | None = None
    error: str | None = None
    content: str | None = None  # a whole (not streamed) answer's text, where the API has one (/infill)

    @property
    def lines(self) -> int | None:
        """The suggestion's lines as an editor shows them (a last newline starts no line)."""
        if self.content is None:
            return None
        return len(self.content.rstrip("\n").split("\n")) if self.content.strip() else 0


@dataclass
class Replay:
    engine: str
    session: str
    answers: list[Answer] = field(default_factory=list)
    seconds: float = 0.0
    restarted: Answer | None = None


def read_session(path: Path) -> list[Request]:
    requests = []
    by_line: dict[int, Request] = {}
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        if "cancelled_request" in record:  # record's mark: the request on that line was hung up on
            if record["cancelled_request"] in by_line:
                by_line[record["cancelled_request"]].cancelled = True
            continue
        route = record.get("path", "").split("?")[0]
        if record.get("method", "POST") != "POST" or route not in GENERATION_PATHS:
            continue
        if not isinstance(record.get("body"), dict):
            raise SystemExit(f"{path}:{number}: no JSON body to replay")
        request = by_line[number] = Request(record["path"], record["body"])
        requests.append(request)
    if not requests:
        raise SystemExit(f"{path}: no generation requests ({', '.join(GENERATION_PATHS)}) to replay")
    return requests


def as_sent(request: Request, *, temperature: float | None, max_tokens: int | None, lift_budgets: bool = False) -> dict:
    body = dict(request.body)
    # The answer's shape only (llama.vim asks for a few flattened fields, none at all for a warm-up): the whole
    # answer carries the timings every engine is measured by.
    body.pop("response_fields", None)
    if lift_budgets and "t_max_predict_ms" in body:
        body["t_max_predict_ms"] = 0  # an editor's time budget off: the whole suggestion
    if temperature is not None:
        body["temperature"] = temperature
        if "temperature" not in body.get("samplers", ["temperature"]):  # a chain without it ignores the field
            body["samplers"] = ["temperature", *body["samplers"]]
    if max_tokens is not None:
        route = request.path.split("?")[0]
        for name in MAX_TOKEN_FIELDS[route]:
            body.pop(name, None)
        body[MAX_TOKEN_FIELDS[route][0]] = max_tokens
    return body


# -- what each prompt shares with the earlier ones ------------------------------------------------
def prompt_tokens(requests: list[Request], target: Path, n_ctx: int) -> list[list[int] | None]:
    """Each request's prompt as localspec renders it in a context of ``n_ctx`` (an editor's chunks get what it
    leaves); None where localspec refuses the request."""
    from localspec.engine.decoding.decoder import SpeculativeDecoder
    from localspec.engine.decoding.sampling import SamplingParams
    from localspec.engine.llama.model import Model
    from localspec.server.worker import GenerationWorker

    worker = GenerationWorker(SpeculativeDecoder(Model(target, vocab_only=True, n_ctx=n_ctx)), SamplingParams())
    prompts = []
    for request in requests:
        try:
            parse = request_parser(request.path.split("?")[0])
            prompts.append(worker.prompt_tokens(parse(request.body)))
        except Exception as exc:  # the server answers it with the same error; the table says n/a
            print(f"  (localspec cannot render a {request.path} request: {exc})", file=sys.stderr)
            prompts.append(None)
    return prompts


def request_parser(route: str):
    """The function the server parses a route's body with, found among the API modules its app imports
    (so this script follows them wherever the translators live)."""
    from types import ModuleType

    from localspec.server import app

    name = PARSERS[route]
    for module in vars(app).values():
        if isinstance(module, ModuleType) and callable(getattr(module, name, None)):
            return getattr(module, name)
    raise SystemExit(f"localspec.server.app uses no module with {name}; update PARSERS in "
                     f"{Path(__file__).relative_to(REPO)}")


def new_tokens(prompts: list[list[int] | None]) -> list[int | None]:
    """Per prompt: its tokens past the longest prefix it shares with any earlier prompt of the session."""
    from localspec.engine.tokens import common_prefix_length

    news = []
    for i, prompt in enumerate(prompts):
        if prompt is None:
            news.append(None)
            continue
        shared = max((common_prefix_length(prompt, p) for p in prompts[:i] if p is not None), default=0)
        news.append(len(prompt) - shared)
    return news


# -- servers ---------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def server(command: list[str], port: int, env: dict, log_path: Path):
    """A server process; yields its base URL once /health answers 200."""
    with log_path.open("a") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"{command[0]} exited with {proc.returncode}; see {log_path}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit(f"{command[0]} did not start in {START_TIMEOUT_S} s; see {log_path}")
            time.sleep(0.5)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def localspec_command(args, port: int) -> list[str]:
    draft = ["--draft", str(args.draft_path)] if args.draft_path else []
    return [sys.executable, "-m", "localspec", "serve", "--port", str(port), "--threads", str(args.threads),
            "--ctx", str(args.ctx), "--target", str(args.target_path), *draft, *args.localspec_args]


def llama_server_command(args, port: int) -> list[str]:
    # --metrics: its Anthropic and Responses streams carry no timings; its counters say what each request cost.
    return [args.llama_server, "-m", str(args.target_path), "-t", str(args.threads), "-c", str(args.ctx),
            "--host", "127.0.0.1", "--port", str(port), "--metrics", *args.llama_server_args]


# -- requests ----------------------------------------------------------------------------------------
def carries_output(event: dict) -> bool:
    """Whether a streamed event holds generated text or a tool call (OpenAI chat/completions, Anthropic,
    Responses)."""
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {}
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls") or choice.get("text"):
            return True
    kind = event.get("type", "")
    return kind == "content_block_delta" or (kind.startswith("response.") and kind.endswith(".delta"))


def last_timings(value) -> dict | None:
    """The last ``timings`` object anywhere in a response body or event."""
    found = None
    if isinstance(value, dict):
        for key, item in value.items():
            found = (item if key == "timings" and isinstance(item, dict) else last_timings(item)) or found
    elif isinstance(value, list):
        for item in value:
            found = last_timings(item) or found
    return found


class Unanswered(Exception):
    """The connection failed or was closed before the server sent any response: nothing was answered."""


def send(client: httpx.Client, base: str, request: Request, body: dict, started: float) -> Answer:
    """One request's answer, its times counted from ``started`` (``perf_counter``); raises ``Unanswered`` when
    the server sent no response at all."""
    first = None
    timings = None
    responded = False
    headers = {"Authorization": "Bearer local", "x-api-key": "local", "anthropic-version": "2023-06-01"}
    try:
        with client.stream("POST", base + request.path, json=body, headers=headers) as response:
            responded = True
            if not body.get("stream"):
                data = response.read()
                elapsed = time.perf_counter() - started
                parsed = json.loads(data) if data else {}
                if response.status_code != 200:
                    return Answer(response.status_code, elapsed, None, error=data.decode(errors="replace")[:200])
                first_answer = parsed[0] if isinstance(parsed, list) and parsed else parsed  # n_cmpl: a list
                content = first_answer.get("content") if isinstance(first_answer, dict) else None
                return with_timings(Answer(200, elapsed, elapsed, content=content), last_timings(first_answer))
            if response.status_code != 200:
                text = response.read().decode(errors="replace")[:200]
                return Answer(response.status_code, time.perf_counter() - started, None, error=text)
            for line in response.iter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                event = json.loads(line[5:])
                if first is None and carries_output(event):
                    first = time.perf_counter() - started
                timings = last_timings(event) or timings
    except httpx.HTTPError as exc:
        # the SDKs retry any transport error (a reset as much as a close) that came before a response
        if not responded and isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.TimeoutException):
            raise Unanswered(str(exc)) from exc
        return Answer(0, time.perf_counter() - started, first, error=str(exc))
    return with_timings(Answer(200, time.perf_counter() - started, first), timings)


def with_timings(answer: Answer, timings: dict | None) -> Answer:
    if timings:
        answer.prompt_n, answer.cache_n = timings.get("prompt_n"), timings.get("cache_n")
        answer.prompt_ms, answer.predicted_n = timings.get("prompt_ms"), timings.get("predicted_n")
        answer.predicted_per_second = timings.get("predicted_per_second")
    return answer


def counters(base: str) -> dict[str, float]:
    """llama-server's Prometheus counters by name ({} where the server has no /metrics, as localspec)."""
    response = httpx.get(f"{base}/metrics", timeout=30)
    if response.status_code != 200:
        return {}
    values = (line.split() for line in response.text.splitlines() if line and not line.startswith("#"))
    return {name.rpartition(":")[2]: float(value) for name, value in values}


def with_counted_timings(answer: Answer, before: dict[str, float], after: dict[str, float]) -> Answer:
    """The answer's timings from the server's counters before and after it, where its body carried none."""
    if answer.prompt_n is not None or not before or not after:
        return answer
    spent = {name: after[name] - before.get(name, 0.0) for name in after}
    answer.prompt_n, answer.cache_n = int(spent["prompt_tokens_total"]), int(spent["prompt_tokens_cached_total"])
    answer.prompt_ms, answer.predicted_n = 1e3 * spent["prompt_seconds_total"], int(spent["tokens_predicted_total"])
    seconds = spent["tokens_predicted_seconds_total"]
    answer.predicted_per_second = answer.predicted_n / seconds if seconds > 0 else None
    return answer


def send_as_clients_do(base: str, request: Request, body: dict) -> tuple[Answer, int]:
    """``send``, retried on a new connection when the server closed one before answering (stock llama-server
    drops a kept-alive connection after some streamed answers), as the clients' SDKs retry connection errors;
    the answer's time includes the failed tries. Returns the answer and the number of retries."""
    started = time.perf_counter()
    for retries in range(CONNECTION_RETRIES + 1):
        try:
            with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
                return send(client, base, request, body, started), retries
        except Unanswered as exc:
            error = str(exc)
    return Answer(0, time.perf_counter() - started, None, error=error), retries


def hang_up(base: str, request: Request, body: dict) -> Answer:
    """Send a request the client abandoned, and abandon it the same way: close the connection mid-answer."""
    started = time.perf_counter()
    try:
        httpx.post(base + request.path, json=body, timeout=HANG_UP_S)
    except httpx.TimeoutException:
        pass
    return Answer(HUNG_UP, time.perf_counter() - started, None)


def replay(base: str, requests: list[Request], args) -> list[Answer]:
    answers = []
    for i, request in enumerate(requests):
        body = as_sent(request, temperature=args.temperature, max_tokens=args.max_tokens,
                       lift_budgets=args.lift_budgets)
        if request.cancelled:
            answers.append(hang_up(base, request, body))
            print(f"  request {i + 1}/{len(requests)} {request.path}: hung up on, as recorded", file=sys.stderr)
            continue
        before = counters(base)
        answer, retries = send_as_clients_do(base, request, body)
        answers.append(with_counted_timings(answer, before, counters(base) if before else {}))
        print(f"  request {i + 1}/{len(requests)} {request.path}: {answer.seconds:.1f} s, "
              f"prefilled {answer.prompt_n}, reused {answer.cache_n}"
              + (f", after {retries} connection retries" if retries else "")
              + (f", HTTP {answer.status}: {answer.error}" if answer.error else ""), file=sys.stderr)
    return answers


def run_engine(engine: str, session: Path, requests: list[Request], args, work: Path) -> Replay:
    result = Replay(engine, session.name)
    home = work / f"home-{engine}-{session.stem}"
    home.mkdir()
    env = {**os.environ, "LOCALSPEC_HOME": str(home)}
    command = localspec_command if engine == "localspec" else llama_server_command
    log = work / f"{engine}-{session.stem}.log"
    print(f"{engine}: {session.name} ({len(requests)} requests), log {log}", file=sys.stderr)
    port = free_port()
    with server(command(args, port), port, env, log) as base:
        started = time.perf_counter()
        result.answers = replay(base, requests, args)
        result.seconds = time.perf_counter() - started
    if engine == "localspec":
        port = free_port()
        with server(command(args, port), port, env, log) as base:
            print(f"{engine}: restarted, the first request again", file=sys.stderr)
            result.restarted = replay(base, requests[:1], args)[0]
    return result


# -- report -----------------------------------------------------------------------------------------
def fmt(value, spec: str = "d") -> str:
    return "-" if value is None else format(value, spec)


def report(session: str, requests: list[Request], prompts, news, replays: dict[str, Replay], *,
           lifted: bool = False) -> dict:
    engines = list(replays)
    print(f"\n== {session}: {len(requests)} requests")
    head = f"{'#':>3} {'api':<22} {'prompt':>7} {'new':>6}"
    for engine in engines:
        head += f" | {engine[:12]:>12}: {'prefill':>7} {'ttft s':>7} {'total s':>8} {'tok/s':>6} {'out':>4} {'lines':>5}"
    print(head)
    checks = []
    for i, request in enumerate(requests):
        prompt = None if prompts[i] is None else len(prompts[i])
        line = f"{i + 1:>3} {request.path.split('?')[0]:<22} {fmt(prompt):>7} {fmt(news[i]):>6}"
        for engine in engines:
            a = replays[engine].answers[i]
            line += (f" | {'':>12}  {fmt(a.prompt_n):>7} {fmt(a.first_token_s, '.2f'):>7} {a.seconds:>8.2f} "
                     f"{fmt(a.predicted_per_second, '.1f'):>6} {fmt(a.predicted_n):>4} {fmt(a.lines):>5}")
            if a.error:
                line += f" HTTP {a.status}"
            elif a.status == HUNG_UP:
                line += " hung up"
        print(line)
        ours = replays.get("localspec")
        if ours and news[i] is not None and ours.answers[i].prompt_n is not None:
            checks.append(ours.answers[i].prompt_n <= news[i] + PREFILL_SLACK)
    print("session time: " + ", ".join(f"{e} {replays[e].seconds:.1f} s" for e in engines))
    verdicts = {}
    if "localspec" in replays:
        verdicts["prefill <= new + 64 on every request"] = bool(checks) and all(checks)
    if {"localspec", "llama-server"} <= set(replays):
        failed = [e for e in engines if any(a.error for a in replays[e].answers)]
        if failed:  # a session cut short by an error is not comparable: say so instead of a verdict
            print(f"session times not comparable: {', '.join(failed)} failed a request")
            verdicts["session faster than llama-server"] = False
        else:
            verdicts["session faster than llama-server"] = (replays["localspec"].seconds
                                                            < replays["llama-server"].seconds)
    suggestions = [i for i, r in enumerate(requests) if r.path.split("?")[0] == "/infill" and not r.cancelled
                   and r.body.get("n_predict", -1) != 0]
    if suggestions and {"localspec", "llama-server"} <= set(replays):
        verdicts.update(editor_verdicts(suggestions, replays["localspec"], replays["llama-server"], lifted=lifted))
    ours = replays.get("localspec")
    if ours and ours.restarted is not None:
        cold_s = (ours.answers[0].prompt_ms or 0.0) / 1000.0
        again = ours.restarted
        print(f"restarted serve, first request: time to first token {fmt(again.first_token_s, '.2f')} s "
              f"(reused {fmt(again.cache_n)}, prefilled {fmt(again.prompt_n)}) vs its cold prefill {cold_s:.2f} s")
        verdicts["restarted first request <= 10% of cold prefill"] = (
            again.first_token_s is not None and cold_s > 0 and again.first_token_s <= RESTART_SHARE * cold_s)
    for name, ok in verdicts.items():
        print(f"{'PASS' if ok else 'FAIL'}: {name}")
    return {"session": session, "paths": [r.path for r in requests],
            "prompt_tokens": [None if p is None else len(p) for p in prompts], "new_tokens": news,
            "engines": {e: asdict(r) for e, r in replays.items()}, "verdicts": verdicts}


def editor_verdicts(indices: list[int], ours: Replay, stock: Replay, *, lifted: bool) -> dict[str, bool]:
    """Issue 46's checks over an editor session's completions (warm-ups and abandoned requests aside)."""
    pairs = [(ours.answers[i], stock.answers[i]) for i in indices]
    if any(a.error or b.error for a, b in pairs):
        print("editor checks not comparable: a completion failed")
        return {"editor session answered": False}
    tokens = [median(a.predicted_n or 0 for a, _ in pairs), median(b.predicted_n or 0 for _, b in pairs)]
    time_ratios = [a.seconds / b.seconds for a, b in pairs if b.seconds > 0]
    fewer_lines = [i + 1 for i, (a, b) in zip(indices, pairs) if (a.lines or 0) < (b.lines or 0)]
    print(f"suggestions ({len(pairs)}): median tokens {tokens[0]:g} vs llama-server {tokens[1]:g}; median time "
          f"{median(a.seconds for a, _ in pairs):.2f} s vs {median(b.seconds for _, b in pairs):.2f} s "
          f"(per request, median ratio {median(time_ratios):.2f}); fewer lines on requests {fewer_lines or 'none'}")
    if lifted:
        return {f"whole suggestion in <= {SUGGESTION_TIME_SHARE}x llama-server's time (median)":
                median(time_ratios) <= SUGGESTION_TIME_SHARE}
    return {f"suggested tokens >= {SUGGESTED_TOKENS_RATIO}x llama-server's (median)":
            tokens[0] >= SUGGESTED_TOKENS_RATIO * tokens[1],
            "never fewer lines than llama-server": not fewer_lines}


def replay_command(args) -> None:
    from localspec.session import resolve_pair

    pair = resolve_pair(profile=args.profile, target=args.target, draft=args.draft, offline=True)
    args.target_path, args.draft_path = pair.target, pair.draft
    engines = args.engines.split(",")
    if "llama-server" in engines:
        args.llama_server = args.llama_server or find_llama_server()
    results = []
    work = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    try:
        for session in args.sessions:
            requests = read_session(session)
            prompts = prompt_tokens(requests, pair.target, args.ctx)
            news = new_tokens(prompts)
            replays = {engine: run_engine(engine, session, requests, args, work) for engine in engines}
            results.append(report(session.name, requests, prompts, news, replays, lifted=args.lift_budgets))
    finally:
        if args.keep_logs:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def find_llama_server() -> str:
    """llama-server from scripts/build-llama-cpp-stock's build, else on PATH."""
    built = subprocess.run([str(REPO / "scripts" / "build-llama-cpp-stock"), "--cached"], capture_output=True,
                           text=True)
    if built.returncode == 0 and (Path(built.stdout.strip()) / "llama-server").is_file():
        return str(Path(built.stdout.strip()) / "llama-server")
    found = shutil.which("llama-server")
    if found is None:
        raise SystemExit("no llama-server: build it (scripts/build-llama-cpp-stock) or pass --llama-server PATH")
    return found


# -- recording -----------------------------------------------------------------------------------------
def record_command(args) -> None:
    """A proxy that appends each request (path and JSON body) to --out and streams the upstream's answer back.

    A client that hangs up before its answer is complete (an editor dropping a stale completion, or quitting)
    is passed on: the proxy drops its upstream request too, so the server cancels as it would for the client,
    and a line ``{"cancelled_request": N, "time": T}`` names the request's line number in --out.
    """
    import asyncio

    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    out_path = Path(args.out)
    lines = len(out_path.read_text().splitlines()) if out_path.exists() else 0
    out = out_path.open("a")
    lock = threading.Lock()
    upstream = httpx.AsyncClient(base_url=args.upstream, timeout=REQUEST_TIMEOUT_S)
    hop = {"host", "content-length", "connection", "transfer-encoding", "accept-encoding"}

    def write(record: dict) -> int:
        """Appends a line; its number in --out (from 1, as read_session counts)."""
        nonlocal lines
        with lock:
            out.write(json.dumps(record) + "\n")
            out.flush()
            lines += 1
            return lines

    async def hung_up(request: HTTPRequest) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    async def forward(request: HTTPRequest):
        raw = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw.decode("utf-8", "replace")
        line = write({"method": request.method, "path": path, "time": time.time(), "body": body})
        headers = {k: v for k, v in request.headers.items() if k.lower() not in hop}
        sent = upstream.build_request(request.method, path, content=raw, headers=headers)
        # A non-streamed answer comes whole after the generation: the client may leave while it is awaited.
        sending = asyncio.ensure_future(upstream.send(sent, stream=True))
        leaving = asyncio.ensure_future(hung_up(request))
        await asyncio.wait({sending, leaving}, return_when=asyncio.FIRST_COMPLETED)
        leaving.cancel()
        if not sending.done():
            sending.cancel()  # closes the upstream connection: the server cancels the request
            write({"cancelled_request": line, "time": time.time()})
            return Response(status_code=499)  # nobody reads it
        answer = sending.result()

        async def relay():
            complete = False
            try:
                async for chunk in answer.aiter_raw():
                    yield chunk
                complete = True
            finally:  # also when the agent goes away: the server then cancels the request too
                await answer.aclose()
                if not complete:
                    write({"cancelled_request": line, "time": time.time()})

        return StreamingResponse(relay(), status_code=answer.status_code,
                                 headers={k: v for k, v in answer.headers.items() if k.lower() not in hop})

    app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST"])])
    print(f"recording to {args.out}: point the agent at http://127.0.0.1:{args.port}", file=sys.stderr)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("replay", help="replay recorded sessions on each engine")
    run.add_argument("sessions", nargs="+", type=Path)
    run.add_argument("--profile")
    run.add_argument("--target", type=Path)
    run.add_argument("--draft", type=Path)
    run.add_argument("--llama-server", help="the stock llama-server binary [build-llama-cpp-stock's, else PATH]")
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--ctx", type=int, default=16384)
    run.add_argument("--engines", default="localspec,llama-server")
    run.add_argument("--temperature", type=float, help="override every request's temperature (0: greedy)")
    run.add_argument("--max-tokens", type=int, help="override every request's answer limit (smoke runs)")
    run.add_argument("--lift-budgets", action="store_true",
                     help="send editors' completions without their time budget (t_max_predict_ms 0)")
    run.add_argument("--localspec-args", type=lambda s: s.split(), default=[],
                     help="more options for localspec serve, one quoted string")
    run.add_argument("--llama-server-args", type=lambda s: s.split(), default=[],
                     help="more options for llama-server, one quoted string")
    run.add_argument("--json", help="write the figures here")
    run.add_argument("--keep-logs", action="store_true", help="keep the servers' logs and homes")
    record = commands.add_parser("record", help="record an agent's requests through a proxy")
    record.add_argument("--upstream", required=True)
    record.add_argument("--port", type=int, default=8090)
    record.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    replay_command(args) if args.command == "replay" else record_command(args)


if __name__ == "__main__":
    main()
