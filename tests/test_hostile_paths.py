"""Names from user profiles and the command line, and symlinks in the cache, never reach outside LOCALSPEC_HOME."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from localspec import paths
from localspec.cli.app import app
from localspec.errors import UnsafePathError
from localspec.profiles import ModelSpec
from localspec.store import cache as store
from tests.tiny_models import TinySpec, tiny_model_bytes

GOOD = {"repo": "owner/name", "file": "model.gguf"}


def invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


def write_profile(name: str, target: dict, draft: dict = GOOD) -> Path:
    def table(role: str, values: dict) -> str:
        # JSON strings are valid TOML basic strings, escapes (\n, \u0000) included.
        return f"[{role}]\n" + "".join(f"{key} = {json.dumps(value)}\n" for key, value in values.items())

    path = paths.user_profiles_dir() / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('description = "hostile"\n' + table("target", target) + table("draft", draft))
    return path


def assert_one_line_error(result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in lines[0]


def nothing_written_under(root: Path) -> bool:
    return not root.exists() or not any(p.is_file() for p in root.rglob("*"))


@pytest.mark.parametrize(
    "key, value",
    [
        ("file", "../../../escape.gguf"),
        ("file", "/etc/passwd"),
        ("file", "sub/dir.gguf"),
        ("file", ".."),
        ("file", ".hidden.gguf"),
        ("file", "model.gguf\n"),
        ("file", "mo del.gguf"),
        ("file", "mod\u00e8l.gguf"),
        ("file", "nul\u0000.gguf"),
        ("file", "C:\\models\\x.gguf"),
        ("file", "x" * 201),
        ("repo", "../name"),
        ("repo", "/abs/name"),
        ("repo", "owner/../../name"),
        ("repo", "owner/name/extra"),
        ("repo", "owner"),
        ("repo", "owner/name\n"),
        ("repo", "..\\..\\name"),
    ],
)
def test_unsafe_names_in_a_user_profile_are_refused(key, value):
    write_profile("hostile", {**GOOD, key: value})
    for command in (("pull", "--profile", "hostile"), ("check", "--profile", "hostile"), ("profiles", "show", "hostile")):
        result = invoke(*command)
        assert_one_line_error(result, 2, "hostile.toml", f"target.{key}", "unsafe")
    assert nothing_written_under(paths.models_dir())


@pytest.mark.parametrize("name", ["../../etc/passwd", "/etc/passwd", "a/b", "..", "name\n", "na me"])
@pytest.mark.parametrize("command", ["pull", "check", "run"])
def test_unsafe_profile_names_on_the_command_line_are_refused(command, name):
    args = [command, "--profile", name] + (["hello"] if command == "run" else [])
    assert_one_line_error(invoke(*args), 2, "profile name", "not allowed")


@pytest.fixture
def outside(tmp_path) -> Path:
    """A directory outside LOCALSPEC_HOME holding a file the cache must never touch."""
    directory = tmp_path / "outside"
    directory.mkdir()
    (directory / "keep.txt").write_text("precious")
    return directory


def spec_for(fake_index, name: str = "tiny") -> ModelSpec:
    return fake_index.model(name, tiny_model_bytes(TinySpec(seed=0)))


@pytest.mark.parametrize("link_at", ["owner", "name", "file"])
def test_a_symlink_in_the_cache_pointing_outside_is_refused(fake_index, outside, link_at):
    spec = spec_for(fake_index)
    path = store.model_path(spec)  # models/test/tiny/tiny.gguf
    link = {"owner": path.parent.parent, "name": path.parent, "file": path}[link_at]
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside / "keep.txt" if link_at == "file" else outside, target_is_directory=link_at != "file")
    with pytest.raises(UnsafePathError, match="resolves outside"):
        store.resolve_model(spec)
    result = invoke("pull", "hf://test/tiny/tiny.gguf")
    assert_one_line_error(result, 2, "resolves outside", "remove the symlink")
    assert sorted(p.name for p in outside.rglob("*")) == ["keep.txt"]
    assert (outside / "keep.txt").read_text() == "precious"


def test_a_symlinked_hub_staging_dir_is_refused(fake_index, outside, monkeypatch):
    payload = tiny_model_bytes(TinySpec(seed=0))
    fake_index.hub["test/hub/hub.gguf"] = payload
    monkeypatch.setenv("HF_ENDPOINT", fake_index.root)
    paths.models_dir().mkdir(parents=True)
    (paths.models_dir() / ".incoming").symlink_to(outside, target_is_directory=True)
    result = invoke("pull", "hf://test/hub/hub.gguf")
    assert result.exit_code == 2 and "staging dir" in result.stderr and "resolves outside" in result.stderr
    assert sorted(p.name for p in outside.rglob("*")) == ["keep.txt"]


def test_a_symlink_that_stays_inside_the_cache_is_fine(fake_index):
    spec = spec_for(fake_index)
    real = store.resolve_model(spec)
    moved = paths.models_dir() / "test" / "elsewhere"
    real.parent.rename(moved)
    real.parent.symlink_to(moved, target_is_directory=True)
    assert store.cached_path(spec) == real
