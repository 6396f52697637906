"""HF_TOKEN never shows up in any output: errors (even when a server echoes it back), JSON, saved chats, doctor."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec.cli.app import app
from tests.fake_index import write_user_profile
from tests.tiny_models import TinySpec, tiny_model_bytes

MARKER = "hf_SECRETmarker7c1d9e"


class _EchoAuthHandler(BaseHTTPRequestHandler):
    """A hostile or misconfigured Hub: every answer is a 401 that repeats the Authorization header back."""

    def log_message(self, *args) -> None:
        pass

    def _answer(self, send_body: bool) -> None:
        auth = self.headers.get("Authorization", "(none)")
        body = json.dumps({"error": f"token {auth} rejected"}).encode()
        self.send_response(401, f"Unauthorized for {auth}")  # the reason phrase ends up in urllib's errors
        self.send_header("X-Error-Message", f"bad credentials {auth}")  # huggingface_hub quotes this header
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_GET(self) -> None:
        self._answer(send_body=True)


@pytest.fixture
def echo_hub(monkeypatch) -> Iterator[list[str]]:
    """HF_ENDPOINT points at the echoing Hub; yields the Authorization headers it received."""
    received: list[str] = []

    class Handler(_EchoAuthHandler):
        def _answer(self, send_body: bool) -> None:
            received.append(self.headers.get("Authorization", ""))
            super()._answer(send_body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield received
    server.shutdown()
    server.server_close()


@pytest.fixture(params=[MARKER, MARKER + "\n"], ids=["token", "token-with-newline"])
def token(request, monkeypatch) -> str:
    monkeypatch.setenv("HF_TOKEN", request.param)
    return request.param


def invoke(*args: object, stdin: str | None = None):
    return CliRunner().invoke(app, [str(a) for a in args], input=stdin)


def assert_no_secret(result, *files: Path) -> None:
    # Also the exception: an uncaught one would print its message (and the token in it) as a traceback.
    texts = [result.stdout, result.stderr, repr(result.exception)] + [f.read_text() for f in files]
    for text in texts:
        assert MARKER not in text


def test_hub_errors_that_echo_the_token_are_redacted(echo_hub, token):
    result = invoke("pull", "hf://owner/name/model.gguf")
    assert result.exit_code == 1 and "401" in result.stderr and "<HF_TOKEN>" in result.stderr
    assert_no_secret(result)
    # Sent (the reachability probe goes without it), and without the stray newline.
    assert {h for h in echo_hub if h} == {f"Bearer {MARKER}"}


def test_header_reads_that_echo_the_token_are_redacted(echo_hub, token):
    result = invoke("check", "hf://owner/name/a.gguf", "hf://owner/name/b.gguf")
    assert result.exit_code == 2 and "Unauthorized" in result.stderr
    assert_no_secret(result)


def test_pull_of_a_profile_falls_back_to_the_mirror_and_prints_no_token(fake_index, echo_hub, token):
    write_user_profile(
        fake_index, "pair", tiny_model_bytes(TinySpec(seed=0)), tiny_model_bytes(TinySpec(seed=0, perturb_seed=1))
    )
    result = invoke("pull", "--profile", "pair")
    assert result.exit_code == 0, result.output
    assert echo_hub  # the Hub was tried with the token first
    assert_no_secret(result)


def test_generation_outputs_hold_no_token(tiny_target, tiny_draft, token, tmp_path):
    pair = ("--target", tiny_target, "--draft", tiny_draft, "--threads", 1)
    ran = invoke("run", *pair, "-n", 8, "--json", "hello world")
    assert ran.exit_code == 0, ran.output
    assert json.loads(ran.stdout)["text"]
    assert_no_secret(ran)

    saved = [tmp_path / "chat.json", tmp_path / "chat.md"]
    chatted = invoke("chat", *pair, "-n", 8, stdin=f"hello\n/save {saved[0]}\n/save {saved[1]}\n")
    assert chatted.exit_code == 0, chatted.output
    assert_no_secret(chatted, *saved)

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"workload": "echo", "prompt": "hello world the code"}) + "\n")
    report = tmp_path / "bench.json"
    benched = invoke(
        "bench", *pair, "--prompts", prompts, "--methods", "none,lookup", "--runs", 1, "-n", 8, "--ctx", 256,
        "--json", report,
    )
    assert benched.exit_code == 0, benched.output
    assert_no_secret(benched, report)


def test_doctor_prints_no_token(token):
    result = invoke("doctor")
    assert result.exit_code == 0, result.output
    assert_no_secret(result)
