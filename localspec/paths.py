"""Where localspec keeps things: everything lives under LOCALSPEC_HOME, and nothing escapes it."""

from __future__ import annotations

import io
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import platformdirs

from localspec.errors import UnsafePathError

ENV_HOME = "LOCALSPEC_HOME"
# One path component: letters, digits and . _ - only; no leading dot (no "..", no hidden files).
_SAFE_COMPONENT = re.compile(r"[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,199}")


def home() -> Path:
    """The root of localspec's cache: $LOCALSPEC_HOME, else the platform's user cache dir."""
    value = os.environ.get(ENV_HOME)
    return Path(value).expanduser() if value else Path(platformdirs.user_cache_dir("localspec"))


def models_dir() -> Path:
    return home() / "models"


def user_profiles_dir() -> Path:
    return home() / "profiles"


def pass_costs_file() -> Path:
    """The target pass costs measured on this machine, remembered across sessions."""
    return home() / "pass-costs.json"


def history_dir() -> Path:
    """Earlier answers, one file per tokenizer, for suffix decoding (``localspec history clear`` empties it)."""
    return home() / "history"


def history_file(tokenizer: str) -> Path:
    return history_dir() / f"{check_component(tokenizer, 'tokenizer identity')}.bin"


def prompt_cache_dir() -> Path:
    """Saved model states of recent prompts, so a restarted server reuses an agent's prompt (bounded)."""
    return home() / "prompt-cache"


def check_component(name: str, what: str) -> str:
    """Return ``name`` if it is a safe single path component, else raise UnsafePathError."""
    if not _SAFE_COMPONENT.fullmatch(name):  # the whole name: a "$" anchor would let a trailing newline through
        raise UnsafePathError(
            f"{what} {name!r} is not allowed: use letters, digits, '.', '_' and '-' only, "
            "with no '/' and no leading '.'"
        )
    return name


def safe_join(base: Path, *components: str, what: str = "name") -> Path:
    """Join checked components under ``base`` and make sure the result (symlinks resolved) stays inside."""
    path = base
    for part in components:
        path = path / check_component(part, what)
    return ensure_inside(base, path, what=f"{what} {'/'.join(components)!r}")


def ensure_inside(base: Path, path: Path, *, what: str) -> Path:
    """Return ``path`` if it stays inside ``base`` once symlinks are resolved, else raise UnsafePathError."""
    root = base.resolve()
    resolved = path.resolve()
    if resolved != root and root not in resolved.parents:
        raise UnsafePathError(f"{what} resolves outside {base}; remove the symlink")
    return path


@contextmanager
def temp_beside(dest: Path) -> Iterator[tuple[Path, io.BufferedWriter]]:
    """A hidden temp file in dest's directory (same filesystem, so os.replace is atomic); removed on any failure."""
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield tmp, out
    finally:
        tmp.unlink(missing_ok=True)
