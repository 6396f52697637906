"""The target over llama.cpp RPC servers (``--rpc``): two real ``localspec rpc-server`` processes on 127.0.0.1,
with latency added by localspec.bench.relay (this kernel has no netem). Greedy output through them equals the
target alone on this machine for every method, at every latency; a server killed or stalled mid-answer is named
in one line within 10 s, and ``serve`` answers again once it is back; a server of another build is refused.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import pytest

from localspec.bench.relay import LatencyRelay
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.llama.rpc import RpcServerError, check_servers, parse_layout
from localspec.server.worker import GenerationWorker
from localspec.session import ModelOptions, Pair, open_decoder
from tests.test_server import ask, ask_streaming, serving

# Methods the tiny pair can run (it has no MTP, EAGLE-3 or DFlash head; test_mtp, test_eagle3 and test_dflash
# cover those drafters' losslessness on one machine).
METHODS = ("none", "draft", "lookup", "hybrid", "auto")
PROMPT_TEXT = "def add(a, b): return a + b\ndef add(a, b): return a + b\ndef add("
# Round trips the issue asks about, in milliseconds.
LATENCIES_MS = (0, 0.5, 2, 5)
START_TIMEOUT_S = 20
LOST_WITHIN_S = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(port: int) -> subprocess.Popen:
    """``localspec rpc-server`` on ``port``, once it accepts connections (bounded wait)."""
    process = subprocess.Popen([sys.executable, "-m", "localspec", "rpc-server", "--port", str(port), "--threads", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert process.poll() is None, "rpc-server exited"
        try:
            check_servers([f"127.0.0.1:{port}"])
            return process
        except RpcServerError:
            assert time.monotonic() < deadline, "rpc-server did not start"
            time.sleep(0.05)


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(10)


@contextmanager
def rpc_server():
    port = free_port()
    process = start_server(port)
    try:
        yield process, port
    finally:
        stop(process)


@pytest.fixture(scope="module")
def servers():
    with rpc_server() as (_, first), rpc_server() as (_, second):
        yield (f"127.0.0.1:{first}", f"127.0.0.1:{second}")


@pytest.fixture(scope="module")
def rpc_target(make_tiny_model):
    """Four layers, so both servers and this machine each hold some (split 1,1,1: one here, three there)."""
    return make_tiny_model("rpc-target", seed=0, logit_scale=8.0, n_layers=4)


def answer(target, draft, method: str, rpc=None, max_tokens: int = 40) -> list[int]:
    decoder = open_decoder(Pair(target, draft, target.name), ModelOptions(n_ctx=512, threads=1, rpc=rpc),
                           method=method, history=False)
    try:
        prompt = decoder.target.tokenize(PROMPT_TEXT, add_bos=True)
        steps = decoder.generate(prompt, max_tokens=max_tokens, sampling=SamplingParams(temperature=0.0))
        return [token for step in steps for token in step.tokens]
    finally:
        decoder.close()
        decoder.target.close()


@pytest.fixture(scope="module")
def alone(rpc_target, tiny_draft):
    """The target alone on this machine, greedy: what every run through RPC must give."""
    return answer(rpc_target, tiny_draft, "none")


@pytest.mark.parametrize("method", METHODS)
def test_greedy_output_over_rpc_equals_the_target_alone_here(method, servers, rpc_target, tiny_draft, alone):
    assert answer(rpc_target, tiny_draft, method, rpc=parse_layout(servers)) == alone


@pytest.mark.parametrize("rtt_ms", LATENCIES_MS)
def test_added_latency_changes_no_token(rtt_ms, servers, rpc_target, tiny_draft, alone):
    relays = [LatencyRelay(("127.0.0.1", int(s.rpartition(":")[2])), rtt_ms=rtt_ms) for s in servers]
    try:
        started = time.monotonic()
        assert answer(rpc_target, tiny_draft, "auto", rpc=parse_layout([r.address for r in relays])) == alone
        # The relay really delays: loading alone takes several round trips per server.
        assert time.monotonic() - started >= rtt_ms / 1000
    finally:
        for relay in relays:
            relay.close()


def test_the_layout_keys_the_pass_costs(servers, rpc_target):
    """A one-machine curve never prices an RPC layout, nor one layout another."""
    identities = []
    for rpc in (None, parse_layout(servers), parse_layout(servers, "2,1,1")):
        # One at a time: an rpc-server serves one client connection at a time.
        decoder = open_decoder(Pair(rpc_target, None, "t"), ModelOptions(n_ctx=256, threads=1, rpc=rpc), method="none")
        identities.append(decoder.target.cost_identity())
        decoder.target.close()
    assert len(set(identities)) == 3
    assert "rpc " not in identities[0] and all(",".join(servers) in i for i in identities[1:])


@pytest.mark.parametrize("fault", ["killed", "stalled"])
def test_a_server_lost_mid_answer_is_named_within_ten_seconds(fault, monkeypatch, servers, rpc_target, tiny_draft):
    monkeypatch.setenv("GGML_RPC_TIMEOUT_MS", "3000")  # read when connecting; the default is 8 s
    with rpc_server() as (process, port):
        lost = f"127.0.0.1:{port}"
        decoder = open_decoder(Pair(rpc_target, tiny_draft, "t"),
                               ModelOptions(n_ctx=512, threads=1, rpc=parse_layout([servers[0], lost])), method="none")
        try:
            prompt = decoder.target.tokenize(PROMPT_TEXT, add_bos=True)
            steps = decoder.generate(prompt, max_tokens=40, sampling=SamplingParams(temperature=0.0))
            next(steps)
            process.send_signal(signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
            started = time.monotonic()
            with pytest.raises(RpcServerError) as raised:
                list(steps)
            assert time.monotonic() - started < LOST_WITHIN_S
            assert raised.value.server == lost and lost in str(raised.value) and "\n" not in str(raised.value)
            with pytest.raises(RpcServerError):  # the broken model never decodes again
                decoder.target.eval([1, 2])
        finally:
            decoder.close()
            decoder.target.close()
            process.send_signal(signal.SIGCONT)


def test_serve_names_the_missing_server_and_answers_once_it_is_back(servers, rpc_target, tiny_draft):
    port = free_port()
    process = start_server(port)
    layout = parse_layout([servers[0], f"127.0.0.1:{port}"])

    def load():
        return open_decoder(Pair(rpc_target, tiny_draft, "t"), ModelOptions(n_ctx=1024, threads=1, rpc=layout),
                            method="auto", history=False)

    worker = GenerationWorker(load(), SamplingParams(temperature=0.0), reopen=load)
    expected = None
    try:
        with serving(worker) as server:
            health = server.base_url.removesuffix("/v1") + "/health"
            expected = ask(server).choices[0].message.content
            stop(process)  # between answers: the next one finds it gone mid-pass
            with pytest.raises(Exception, match="127.0.0.1"):
                ask_streaming(server)
            reply = httpx.get(health)
            assert reply.status_code == 503 and reply.json()["missing_rpc_server"] == f"127.0.0.1:{port}"
            process = start_server(port)
            assert ask(server).choices[0].message.content == expected
            assert httpx.get(health).json()["status"] == "ok"
    finally:
        stop(process)
        worker.decoder.close()
        worker.decoder.target.close()


class FakeServer:
    """A peer that answers HELLO with ``version`` and closes on anything else, as a stock rpc-server of that
    protocol does on localspec's build query (one connection, then it stops)."""

    def __init__(self, version: tuple[int, int, int]) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(10)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self.serve, args=(version,), daemon=True)
        self.thread.start()

    def serve(self, version) -> None:
        with self.listener, self.listener.accept()[0] as sock:
            command, size = struct.unpack("<BQ", sock.recv(9, socket.MSG_WAITALL))
            sock.recv(size, socket.MSG_WAITALL)
            assert command == 14  # HELLO
            sock.sendall(struct.pack("<Q", 28) + bytes([*version, 0]) + bytes(24))
            sock.recv(9, socket.MSG_WAITALL)  # the build query: a stock server hangs up


@pytest.mark.parametrize(("version", "reason"), [((6, 0, 0), "speaks protocol 6.0.0"),
                                                 ((7, 0, 0), "is not localspec's build")])
def test_a_server_of_another_protocol_or_build_is_refused_with_the_reason(version, reason):
    fake = FakeServer(version)
    with pytest.raises(RpcServerError, match=reason):
        check_servers([fake.address])
    fake.thread.join(10)


def test_a_stock_rpc_server_is_refused():
    """The real stock rpc-server from scripts/build-llama-cpp-stock, where it is built."""
    found = subprocess.run(["scripts/build-llama-cpp-stock", "--cached"], capture_output=True, text=True)
    binary = found.stdout.strip() + "/ggml-rpc-server"
    if found.returncode or not os.path.exists(binary):
        pytest.skip("stock llama.cpp with rpc-server is not built here (scripts/build-llama-cpp-stock)")
    port = free_port()
    process = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                check_servers([f"127.0.0.1:{port}"])
                pytest.fail("a stock rpc-server was accepted")
            except RpcServerError as exc:
                if "not localspec's build" in str(exc):
                    break
                assert time.monotonic() < deadline, str(exc)
                time.sleep(0.05)
    finally:
        stop(process)


def test_unreachable_server_and_bad_addresses_are_one_line_errors():
    with pytest.raises(RpcServerError, match="cannot reach RPC server 127.0.0.1:.*localspec rpc-server"):
        check_servers([f"127.0.0.1:{free_port()}"])
    for bad, fix in (("nohost", "HOST:PORT"), ("a:1,a:1", "twice")):
        with pytest.raises(Exception, match=fix):
            parse_layout(bad)
    with pytest.raises(Exception, match="3 non-negative shares"):
        parse_layout("127.0.0.1:1,127.0.0.1:2", "1,1")


@pytest.mark.real
def test_real_pair_over_rpc_equals_the_target_alone(qwen_pair, servers):
    target, draft = qwen_pair
    expected = answer(target, draft, "none", max_tokens=48)
    for method in ("auto", "draft"):
        assert answer(target, draft, method, rpc=parse_layout(servers), max_tokens=48) == expected
