"""Writing a bench recommendation into a user profile: the measured pair with the recommended defaults.

The file follows the strict schema of ``localspec.profiles`` and is read back with its parser before it
replaces anything, so a profile written here always loads.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import fields, is_dataclass, replace
from pathlib import Path

import tomli_w

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
    document = {"description": description, "target": _table(target), "draft": _table(draft), "defaults": _table(defaults)}
    return tomli_w.dumps(document)


def _table(value: object) -> dict:
    """A dataclass as a TOML table; None means "let localspec choose" and has no TOML spelling: left out."""
    table = {}
    for f in fields(value):
        item = getattr(value, f.name)
        if isinstance(item, tuple):  # a spec's mirrors: an array of tables
            item = [_table(entry) if is_dataclass(entry) else entry for entry in item] or None
        if item is not None:
            table[f.name] = item
    return table
