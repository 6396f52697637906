"""The Hugging Face Hub as a model source: a resumable download, or only the first bytes (a GGUF header)."""

from __future__ import annotations

import errno
import io
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from localspec import paths
from localspec.errors import StoreError
from localspec.profiles import ModelSpec
from localspec.store import http

HF_SCHEME = "hf://"
HF_ETAG_TIMEOUT_S = 10
# Endpoints found unreachable in this process, with why: the next file skips them at once (a pair is two
# files, and the Hub does not come back between them).
_unreachable: dict[str, str] = {}

# progress(description, done_bytes, total_bytes); total 0 means unknown.
Progress = Callable[[str, int, int], None]


@contextmanager
def download(spec: ModelSpec, progress: Progress) -> Iterator[Path]:
    """hf_hub_download into a hidden staging dir (it resumes from its own .incomplete file); yields the file.

    The staged file is removed afterwards; the caller verifies and installs it meanwhile.
    """
    from huggingface_hub import hf_hub_download  # deferred: heavy, and only a Hub download needs it

    # huggingface_hub retries a dead host for long, which would delay the mirror: fail fast first.
    if endpoint() in _unreachable:
        raise StoreError(_unreachable[endpoint()])
    try:
        http.reachable(endpoint(), timeout=HF_ETAG_TIMEOUT_S)
    except StoreError as exc:
        _unreachable[endpoint()] = str(exc)
        raise
    owner, name = spec.repo.split("/")
    # Checked like the cache itself: a symlinked staging dir would send the download, and its cleanup, elsewhere.
    staging = paths.ensure_inside(
        paths.models_dir(), paths.models_dir() / ".incoming" / owner / name, what="the download staging dir"
    )
    try:
        local = hf_hub_download(
            repo_id=spec.repo,
            filename=spec.file,
            local_dir=staging,
            endpoint=endpoint(),
            token=token(),
            etag_timeout=HF_ETAG_TIMEOUT_S,
            tqdm_class=_progress_tqdm(progress, f"{spec.file} (Hugging Face)"),
        )
    except Exception as exc:  # huggingface_hub raises many types; each becomes one line below
        _tidy_staging(staging)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the store turns it into DiskFullError
        raise StoreError(redact(_failure(exc))) from exc
    staged = Path(local)
    try:
        yield staged
    finally:
        staged.unlink(missing_ok=True)
        _tidy_staging(staging)


def prefix(spec: ModelSpec, max_bytes: int) -> bytes:
    """The file's first ``max_bytes``, by a Range request (the token does not follow a redirect to the CDN)."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(spec.repo, spec.file, endpoint=endpoint())
    headers = {"Range": f"bytes=0-{max_bytes - 1}"}
    hub_token = token()
    if hub_token:
        headers["Authorization"] = f"Bearer {hub_token}"
    try:
        with http.get(url, headers, timeout=HF_ETAG_TIMEOUT_S) as response:
            return http.read(response, max_bytes)
    except StoreError as exc:
        raise StoreError(redact(str(exc))) from exc


def token() -> str | None:
    """HF_TOKEN (else the token huggingface_hub stored), without the stray newline a paste can leave."""
    from huggingface_hub import get_token

    return get_token()


def redact(message: str) -> str:
    """``message`` with the Hub token blanked: servers echo request headers in their error messages."""
    hub_token = token()
    return message.replace(hub_token, "<HF_TOKEN>") if hub_token else message


def endpoint() -> str:
    # huggingface_hub reads HF_ENDPOINT once at import; read it per call so a changed environment counts.
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _tidy_staging(staging: Path) -> None:
    """Drop the Hub's staging dir unless it holds a partial download that the next pull can resume."""
    if any(staging.rglob("*.incomplete")):
        return
    shutil.rmtree(staging, ignore_errors=True)
    for parent in (staging.parent, staging.parent.parent):  # .incoming/OWNER, then .incoming, once empty
        try:
            parent.rmdir()
        except OSError:
            return


def _failure(exc: Exception) -> str:
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, LocalEntryNotFoundError, RepositoryNotFoundError

    if isinstance(exc, LocalEntryNotFoundError):
        # huggingface_hub wraps the HEAD request's failure; an HTTP status means the Hub did answer.
        status = getattr(getattr(exc.__cause__, "response", None), "status_code", None)
        if status == 404:
            return "file not found in the repo (HTTP 404)"
        return f"HTTP {status} from {endpoint()}" if status else f"{endpoint()} is unreachable"
    if isinstance(exc, GatedRepoError):
        return "repo is gated: accept its license on the Hub and set HF_TOKEN"
    if isinstance(exc, RepositoryNotFoundError):
        return "repo not found (or private: set HF_TOKEN)"
    if isinstance(exc, EntryNotFoundError):
        return "file not found in the repo (HTTP 404)"
    first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return f"{type(exc).__name__}: {first_line}"


def _progress_tqdm(progress: Progress, description: str):
    """A tqdm class for huggingface_hub that reports to our callback instead of drawing a bar."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class _Forward(hf_tqdm):
        def __init__(self, *args, **kwargs):
            kwargs.update(disable=False, file=io.StringIO())
            super().__init__(*args, **kwargs)

        def display(self, msg=None, pos=None):
            progress(description, int(self.n), int(self.total or 0))
            return True

    return _Forward
