"""The real coding agents, unmodified, against ``localspec serve`` on the real pair: Claude Code, Codex CLI
and opencode at the versions scripts/lib/agents.sh pins, each run headless and offline as the README's
"Pointing agents at it" shows.

Each client gets a text turn and a tool round trip (the client runs the tool, sends its result, the
server answers). A recording proxy between client and server keeps every request as sent (path and
body, one per line, the shape of tests/data/agent-sessions/) and the server's ``timings`` of its answer.
Set ``LOCALSPEC_RECORD_SESSIONS=DIR`` to keep the recordings there.

The clients come from scripts/test (``LOCALSPEC_AGENTS_DIR``, or the cache dir agents.sh installs into);
without them these tests skip. On a 2-core CPU the 1.5B target prefills about 80 tokens/s, and a client's
first prompt is 7k-9k tokens, so each test costs one to three minutes.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import textwrap
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import platformdirs
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from localspec.engine.tokens import common_prefix_length
from localspec.prompt_cache import DEFAULT_DISK_MIB, DEFAULT_RAM_MIB, MIB, PromptCache
from tests.test_agents_requests import translate
from tests.test_server import open_worker, serving

# Claude Code's first prompt with its default tools is 12k-19k tokens; the tests offer it fewer tools.
N_CTX = 16384
CLIENT_TIMEOUT_S = 1500
# The file the tool round trip reads, and the word only its content holds.
NOTES = "notes.txt"
CODE_WORD = "PELICAN-42"
# The tool task names each client's own way to read a file: a 1.5B model does not find it alone.
TOOL_TASK = "Read the file {notes} with {tool} and tell me the code word written in it."
TEXT_TASK = "Reply with one word: what is the capital of France?"


def agents_bin() -> Path:
    """Where the pinned clients' executables are (scripts/test installs them), or skip."""
    given = os.environ.get("LOCALSPEC_AGENTS_DIR")
    candidates = [Path(given)] if given else sorted(
        Path(platformdirs.user_cache_dir("localspec"), "agents").glob("*/node_modules/.bin"))
    for candidate in candidates:
        if all((candidate / name).exists() for name in ("claude", "codex", "opencode")):
            return candidate
    pytest.skip("the agent clients are not installed; scripts/test installs them (scripts/lib/agents.sh)")


# -- the recording proxy -------------------------------------------------------------------------------
class Recorder:
    """A reverse proxy in front of the server that records each request as sent and its answer's timings."""

    def __init__(self, upstream: str, client: str) -> None:
        self.upstream, self.client = upstream, client
        self.requests: list[dict] = []
        self.app = Starlette(routes=[Route("/{path:path}", self._forward, methods=["GET", "POST"])])

    async def _forward(self, request: Request):
        body = await request.body()
        record = {"client": self.client, "path": request.url.path + (f"?{request.url.query}" if request.url.query
                                                                        else ""),
                  "body": json.loads(body) if body else None}
        if request.method == "POST":
            self.requests.append(record)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        client = httpx.AsyncClient(timeout=None)
        upstream = await client.send(client.build_request(request.method, self.upstream + record["path"],
                                                          headers=headers, content=body), stream=True)

        async def relay():
            seen = b""
            try:
                async for chunk in upstream.aiter_raw():
                    seen += chunk
                    yield chunk
            finally:
                await upstream.aclose()
                await client.aclose()
                record["status"] = upstream.status_code
                record["timings"] = _last_timings(seen.decode("utf-8", "replace"))

        return StreamingResponse(relay(), status_code=upstream.status_code,
                                 headers={k: v for k, v in upstream.headers.items()
                                          if k.lower() in ("content-type", "cache-control")})

    def save(self, path: Path) -> None:
        with path.open("w") as out:
            for record in self.requests:
                out.write(json.dumps({k: record[k] for k in ("client", "path", "body")}, ensure_ascii=False) + "\n")


def _last_timings(text: str) -> dict | None:
    """The server's ``timings`` in a JSON answer or the last SSE event that carries them."""
    for payload in reversed([text] + [line[6:] for line in text.splitlines() if line.startswith("data: ")]):
        try:
            value = json.loads(payload)
        except ValueError:
            continue
        for holder in (value, value.get("response") or {}) if isinstance(value, dict) else ():
            if isinstance(holder, dict) and "timings" in holder:
                return holder["timings"]
    return None


@contextmanager
def recording(server, client: str):
    recorder = Recorder(server.base_url.removesuffix("/v1"), client)
    proxy = uvicorn.Server(uvicorn.Config(recorder.app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=proxy.run, daemon=True)
    thread.start()
    while not proxy.started:
        assert thread.is_alive(), "the recording proxy did not start"
        time.sleep(0.01)
    port = proxy.servers[0].sockets[0].getsockname()[1]
    try:
        yield recorder, f"http://127.0.0.1:{port}"
    finally:
        proxy.should_exit = True
        thread.join(30)
        keep = os.environ.get("LOCALSPEC_RECORD_SESSIONS")
        if keep and recorder.requests:
            recorder.save(Path(keep) / f"{client}-{time.strftime('%Y%m%d-%H%M%S')}.jsonl")


@pytest.fixture(scope="module")
def real_server(qwen_pair, tmp_path_factory):
    """The real pair served as `localspec serve` serves it: with the prompt cache across conversations."""
    target, draft = qwen_pair
    cache = PromptCache(tmp_path_factory.mktemp("prompt-cache"), ram_bytes=DEFAULT_RAM_MIB * MIB,
                        disk_bytes=DEFAULT_DISK_MIB * MIB)
    with serving(open_worker(target, draft, n_ctx=N_CTX, threads=None, prompt_cache=cache)) as server:
        yield server


@pytest.fixture
def project(tmp_path) -> Path:
    """An empty home (no user configuration) and a project directory with the file the tool turn reads."""
    (tmp_path / "home").mkdir()
    work = tmp_path / "project"
    work.mkdir()
    (work / NOTES).write_text(f"Meeting notes.\nThe code word is {CODE_WORD}.\n")
    return tmp_path


def run_client(argv: list[str], project: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    environment = {"PATH": os.environ["PATH"], "HOME": str(project / "home"), "LANG": "C.UTF-8", **env}
    result = subprocess.run(argv, cwd=project / "project", env=environment, capture_output=True, text=True,
                            timeout=CLIENT_TIMEOUT_S, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, f"{argv[0]} exited {result.returncode}:\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result


def answered(recorder: Recorder) -> None:
    """Every request the client sent was answered (200, with the server's timings)."""
    assert recorder.requests
    for record in recorder.requests:
        assert record.get("status") == 200 and record.get("timings"), record["path"]


def sent_tool_result(recorder: Recorder) -> bool:
    """Whether a later request carries the tool's output (the file's content) back to the server."""
    return any(CODE_WORD in json.dumps(r["body"]) for r in recorder.requests)


# -- the clients, as the README runs them ----------------------------------------------------------------
# "{url}" is the server's base URL, "..." the task.
CLAUDE = ("ANTHROPIC_BASE_URL={url} ANTHROPIC_AUTH_TOKEN=local ANTHROPIC_MODEL=local ANTHROPIC_SMALL_FAST_MODEL=local "
          "DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 "
          'claude -p "..." --tools Read --output-format json')
CODEX = 'LOCALSPEC_API_KEY=local codex exec --skip-git-repo-check "..."'
CODEX_CONFIG = """model = "local"
model_provider = "localspec"
[model_providers.localspec]
name = "localspec"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "LOCALSPEC_API_KEY"
"""
OPENCODE = 'opencode run "..."'
OPENCODE_CONFIG = """{{"provider": {{"localspec": {{"npm": "@ai-sdk/openai-compatible", "name": "localspec",
  "options": {{"baseURL": "{url}/v1"}}, "models": {{"local": {{"name": "localspec"}}}}}}}},
 "model": "localspec/local"}}"""
README_URL = "http://127.0.0.1:8080"


def command(line: str, url: str, task: str) -> tuple[dict[str, str], list[str]]:
    """The environment and argv of a README command line for the server at ``url``."""
    words = shlex.split(line.format(url=url))
    cut = next(i for i, word in enumerate(words) if "=" not in word)
    argv = [task if word == "..." else word for word in words[cut:]]
    return dict(word.split("=", 1) for word in words[:cut]), [str(agents_bin() / argv[0]), *argv[1:]]


def claude(url: str, project: Path, task: str) -> str:
    env, argv = command(CLAUDE, url, task)
    answer = json.loads(run_client(argv, project, env).stdout)
    assert answer["is_error"] is False, answer
    return answer["result"]


def codex(url: str, project: Path, task: str) -> str:
    config = project / "home" / ".codex"
    config.mkdir(exist_ok=True)
    (config / "config.toml").write_text(CODEX_CONFIG.format(url=url))
    env, argv = command(CODEX, url, task)
    return run_client(argv, project, env).stdout  # the last message; the progress goes to stderr


def opencode(url: str, project: Path, task: str) -> str:
    (project / "project" / "opencode.json").write_text(OPENCODE_CONFIG.format(url=url))
    env, argv = command(OPENCODE, url, task)
    return run_client(argv, project, env).stdout


def test_the_readme_shows_what_these_tests_run():
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    section = readme[readme.index("### Pointing agents at it"):readme.index("### Pointing editors at it")]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, re.S)
    unindent = {kind: textwrap.dedent(block) for kind, block in blocks}
    assert json.loads(unindent["json"]) == json.loads(OPENCODE_CONFIG.format(url=README_URL))
    assert unindent["toml"] == CODEX_CONFIG.format(url=README_URL)
    assert " ".join(unindent["sh"].replace("\\\n", " ").split()) == CLAUDE.format(url=README_URL)
    for line in (CODEX, OPENCODE):
        assert f"`{line}`" in " ".join(section.split())


# -- the turns -----------------------------------------------------------------------------------------
# Each client: how to run it, and the one endpoint it uses.
CLIENTS = {"claude-code": (claude, "/v1/messages?beta=true", "the Read tool"),
           "codex": (codex, "/v1/responses", f"the exec_command tool (run `cat {NOTES}`)"),
           "opencode": (opencode, "/v1/chat/completions", "the read tool")}


# What each turn asks, and what its answer must hold.
TURNS = {"text": (TEXT_TASK, "paris"), "tool": (TOOL_TASK, CODE_WORD.lower())}


@pytest.mark.real
@pytest.mark.parametrize("turn", TURNS)
@pytest.mark.parametrize("client", CLIENTS)
def test_a_text_turn_and_a_tool_round_trip(real_server, project, client, turn):
    """The tool turn: the client runs its file-reading tool and sends the file back, the server answers that
    request; and the answer quotes the file."""
    run, path, tool = CLIENTS[client]
    task, expected = TURNS[turn]
    with recording(real_server, client) as (recorder, url):
        answer = run(url, project, task.format(notes=NOTES, tool=tool))
    answered(recorder)
    assert {r["path"] for r in recorder.requests} == {path}
    assert turn == "text" or sent_tool_result(recorder)
    if (client, turn) == ("codex", "tool") and expected not in answer.lower():
        # The round trip above is the server's part. What the model then writes is its own: the default
        # pair's 1.5B model answers Codex's exec_command output by calling Codex's write_stdin with the
        # file's content (10 of 10 replays of a recorded round trip with the output's chunk id and wall time
        # varied), and then often nothing; it quotes the code word only when that would-be call names an
        # invalid session_id and is read as text.
        pytest.xfail("the 1.5B model calls write_stdin instead of quoting Codex's tool output")
    assert expected in answer.lower()


# -- an interleaved session ------------------------------------------------------------------------------
@pytest.mark.real
def test_opencode_interleaved_session_prefills_only_new_tokens(real_server, project):
    """Two ``opencode run``s in one project, each sending its title agent's request before its main one:
    every request prefills at most what no earlier request of the session shares with it, plus 64 tokens."""
    with recording(real_server, "opencode") as (recorder, url):
        opencode(url, project, TEXT_TASK)
        opencode(url, project, "And of Italy? One word.")
    answered(recorder)
    earlier: list[list[int]] = []
    for record in recorder.requests:
        prompt = real_server.worker.prompt_tokens(translate(record))
        shared = max((common_prefix_length(prompt, tokens) for tokens in earlier), default=0)
        assert record["timings"]["prompt_n"] <= len(prompt) - shared + 64, record["timings"]
        earlier.append(prompt)

