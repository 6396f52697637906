"""Writing a bench recommendation into a user profile: the measured pair with the recommended defaults.

The file follows the strict schema of ``localspec.profiles`` and is read back with its parser before it
replaces anything, so a profile written here always loads.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import fields, replace
from pathlib import Path

from localspec import paths
from localspec.errors import UsageError
from localspec.profiles import Defaults, ModelSpec, Profile, parse_profile_file


def write_tuned_profile(name: str, base: Profile, method: str, draft_len: int | None, note: str) -> Path:
    """Store ``base``'s models and defaults, with ``method``/``draft_len`` replaced, as user profile ``name``."""
    paths.check_component(name, "profile name")
    directory = paths.user_profiles_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = paths.safe_join(directory, f"{name}.toml", what="profile name")
    defaults = replace(base.defaults, method=method, draft_len=draft_len)
    text = render_profile(f"{base.description}; {note}", base.target, base.draft, defaults)
    try:
        # Staged under the profile's own name (the parser checks it) in a hidden directory profiles ignore.
        with tempfile.TemporaryDirectory(dir=directory, prefix=".staging-") as staging_dir:
            staging = Path(staging_dir) / path.name
            staging.write_text(text, encoding="utf-8")
            parse_profile_file(staging)  # never leave behind a profile that does not load
            os.replace(staging, path)
    except OSError as exc:
        raise UsageError(f"cannot write profile {path}: {exc}") from exc
    return path


def render_profile(description: str, target: ModelSpec, draft: ModelSpec, defaults: Defaults) -> str:
    lines = [f"description = {_value(description)}"]
    for role, spec in (("target", target), ("draft", draft)):
        lines += ["", f"[{role}]"]
        lines += [
            f"{key} = {_value(getattr(spec, key))}"
            for key in ("repo", "file", "size", "sha256")
            if getattr(spec, key) is not None
        ]
        for mirror in spec.mirrors:
            lines += ["", f"[[{role}.mirrors]]"]
            lines += [
                f"{f.name} = {_value(getattr(mirror, f.name))}"
                for f in fields(mirror)
                if getattr(mirror, f.name) is not None
            ]
    lines += ["", "[defaults]"]
    # None means "let localspec choose" and has no TOML spelling: leave those keys out.
    lines += [
        f"{f.name} = {_value(getattr(defaults, f.name))}"
        for f in fields(defaults)
        if getattr(defaults, f.name) is not None
    ]
    return "\n".join(lines) + "\n"


def _value(value: object) -> str:
    """A TOML literal; JSON's string escapes are valid TOML basic-string escapes."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"no TOML spelling for {type(value).__name__}")
