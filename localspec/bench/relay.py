"""A TCP relay on 127.0.0.1 that adds latency per round trip, standing in for a network (no netem here).

``LatencyRelay(("127.0.0.1", 50052), rtt_ms=2)`` listens on a free loopback port and forwards each connection to
the server, delaying every chunk by half the round trip in each direction, in order. The bench puts one in front
of each RPC server (``--rpc-latency-ms``) and the tests use it too. Loopback only; every loop ends when the relay
is closed or a side hangs up.
"""

from __future__ import annotations

import heapq
import selectors
import socket
import threading
import time

# How long a blocking wait may last before the loops look at ``closed`` again.
_POLL_S = 0.05


class LatencyRelay:
    """Forwards ``127.0.0.1:port`` to ``upstream`` with ``rtt_ms`` added per round trip; a context manager."""

    def __init__(self, upstream: tuple[str, int], *, rtt_ms: float) -> None:
        if upstream[0] not in ("127.0.0.1", "localhost"):
            raise ValueError(f"the relay forwards to loopback only, not {upstream[0]}")
        self.upstream = upstream
        self.delay_s = rtt_ms / 2000  # each direction
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_POLL_S)
        self.port = self._listener.getsockname()[1]
        self.closed = threading.Event()
        self._threads = [threading.Thread(target=self._accept, name="latency-relay", daemon=True)]
        self._threads[0].start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # the listener was closed
                return
            try:
                server = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                client.close()  # the server is down: the client sees a closed connection, as without a relay
                continue
            thread = threading.Thread(target=self._pump, args=(client, server), name="latency-relay", daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        """Both directions of one connection: read what arrives, send each chunk once its delay is over."""
        peer = {client: server, server: client}
        due: list[tuple[float, int, socket.socket, bytes]] = []  # (send at, order, to, data)
        order = 0
        with selectors.DefaultSelector() as selector, client, server:
            for sock in peer:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.setblocking(True)
                selector.register(sock, selectors.EVENT_READ)
            while not self.closed.is_set():
                wait = _POLL_S if not due else min(_POLL_S, max(0.0, due[0][0] - time.monotonic()))
                for key, _ in selector.select(wait):
                    try:
                        data = key.fileobj.recv(1 << 20)
                    except OSError:
                        data = b""
                    if not data:  # one side hung up: so does the relay, to the other
                        return
                    order += 1
                    heapq.heappush(due, (time.monotonic() + self.delay_s, order, peer[key.fileobj], data))
                while due and due[0][0] <= time.monotonic():
                    _, _, to, data = heapq.heappop(due)
                    try:
                        to.sendall(data)
                    except OSError:
                        return

    def close(self) -> None:
        self.closed.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=2)

    def __enter__(self) -> LatencyRelay:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
