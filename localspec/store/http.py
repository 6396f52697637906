"""The one HTTP client behind every download: huggingface_hub's shared session and its retries.

Transient failures (connection errors, timeouts, HTTP 408, 429 and 5xx) are retried with exponential
backoff; everything else fails at once, as a StoreError of one line that says what to check. Redirects
are followed, and the Authorization header is dropped when one leaves the host (a Hub file redirects
to a CDN, which must not see the token).
"""

from __future__ import annotations

import logging

from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import httpx2
from huggingface_hub.utils import http_backoff, http_stream_backoff

from localspec import __version__
from localspec.errors import StoreError, debug_enabled

TIMEOUT_S = 30
# Waits of 1, 2 and 4 s: a blip passes, a server that stays broken fails within seconds.
RETRIES = 3
# Failures after the connection was made. A host that cannot be reached (unresolvable, refused, silent) fails
# at once: retrying it would only delay the next source, e.g. the mirror where the Hub does not resolve.
TRANSIENT = (httpx2.ReadTimeout, httpx2.WriteTimeout, httpx2.ReadError, httpx2.WriteError, httpx2.RemoteProtocolError)
CHUNK = 1 << 20
USER_AGENT = f"localspec/{__version__}"

# huggingface_hub logs every failed try on stderr ("'[Errno -2] Name or service not known' thrown while requesting
# HEAD https://huggingface.co", once per file where the Hub does not resolve); the store reports its failures
# itself, in one line, so the library's log shows only with LOCALSPEC_DEBUG (configured at its import, above).
if not debug_enabled():
    logging.getLogger("huggingface_hub").setLevel(logging.CRITICAL + 1)


class NotFoundError(StoreError):
    """The server answered 404."""


@contextmanager
def get(url: str, headers: dict[str, str] | None = None, *, timeout: float = TIMEOUT_S) -> Iterator[httpx2.Response]:
    """GET ``url`` as a stream; an HTTP error status or an unreachable host becomes a StoreError."""
    try:
        with http_stream_backoff(
            "GET", url, headers=_headers(headers), timeout=timeout, follow_redirects=True,
            max_retries=RETRIES, retry_on_exceptions=TRANSIENT,
        ) as response:
            if response.status_code >= 400:
                raise _status_error(response.status_code, response.reason_phrase, url)
            yield response
    except (httpx2.HTTPError, OSError) as exc:  # OSError: huggingface_hub's offline mode, among others
        response = getattr(exc, "response", None)  # retries used up on a 5xx
        if response is not None:
            raise _status_error(response.status_code, response.reason_phrase, url) from exc
        raise StoreError(f"cannot reach {urlsplit(url).netloc or url} ({exc or type(exc).__name__}); "
                         "check the network or the URL") from exc


def read(response: httpx2.Response, max_bytes: int | None = None) -> bytes:
    """The body (or its first ``max_bytes``) of a response from ``get``; a cut connection is a StoreError."""
    chunks, size = [], 0
    for chunk in iter_bytes(response, what=str(response.url)):
        chunks.append(chunk)
        size += len(chunk)
        if max_bytes is not None and size >= max_bytes:
            break
    return b"".join(chunks)[:max_bytes]


def iter_bytes(response: httpx2.Response, *, what: str) -> Iterator[bytes]:
    """The body in chunks; a connection that breaks off midway is a StoreError (retry the pull)."""
    try:
        yield from response.iter_bytes(CHUNK)
    except (httpx2.HTTPError, OSError) as exc:
        raise StoreError(f"download of {what} broke off ({exc or type(exc).__name__}); retry the pull") from exc


def reachable(url: str, *, timeout: float) -> None:
    """One quick HEAD, no retries: any HTTP answer means the host is up; otherwise a StoreError."""
    try:
        http_backoff(
            "HEAD", url, headers=_headers(None), timeout=timeout, follow_redirects=False,
            max_retries=0, retry_on_status_codes=(),
        )
    except (httpx2.HTTPError, OSError) as exc:
        raise StoreError(f"{url} is unreachable ({exc or type(exc).__name__})") from exc


def _headers(headers: dict[str, str] | None) -> dict[str, str]:
    return {"User-Agent": USER_AGENT, **(headers or {})}


def _status_error(status: int, reason: str, url: str) -> StoreError:
    return (NotFoundError if status == 404 else StoreError)(f"HTTP {status} ({reason}) for {url}")
