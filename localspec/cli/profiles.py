"""``localspec profiles``: list the profiles; ``localspec profiles show NAME``: print one."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from localspec.cli.console import format_size, out
from localspec.cli.listing import listing_group
from localspec.profiles import DEFAULT_PROFILE, ModelSpec, list_profiles, load_profile
from localspec.store import cache as store


def _list(json_output: bool) -> None:
    """List shipped and user profiles with sizes, method and whether both models are downloaded."""
    profiles = list_profiles()
    rows = [
        {
            "name": profile.name,
            "default": profile.name == DEFAULT_PROFILE,
            "target_bytes": profile.target.size,
            "draft_bytes": None if profile.draft is None else profile.draft.size,
            "method": profile.defaults.method,
            "downloaded": all(store.model_path(s).is_file() for s in _models(profile).values()),
            "description": profile.description,
        }
        for profile in profiles
    ]
    if json_output:
        out.print(json.dumps(rows, indent=2), markup=False, highlight=False)
        return
    table = Table(box=None, pad_edge=False)
    for column in ("name", "target", "draft", "method", "downloaded", "description"):
        table.add_column(column)
    for profile, row in zip(profiles, rows):
        table.add_row(
            row["name"] + (" (default)" if row["default"] else ""),
            format_size(row["target_bytes"]),
            "its own MTP head" if profile.draft is None else format_size(row["draft_bytes"]),
            row["method"],
            "yes" if row["downloaded"] else "no",
            row["description"],
        )
    out.print(table)


app = listing_group("List model profiles (target/draft pairs) or show one.", _list)


@app.command("show")
def show_command(name: str = typer.Argument(..., help="Profile name, as listed by `localspec profiles`.")) -> None:
    """Print one profile: its file, both models with sources and hashes, and its defaults."""
    profile = load_profile(name)
    out.prose(f"{profile.name}: {profile.description}")
    out.prose(f"  file: {profile.path}")
    for role, spec in _models(profile).items():
        _print_model(role, spec)
    if profile.draft is None:
        out.prose("  draft: none, the target drafts with its own MTP head (--method mtp or auto)")
    out.print("  defaults:")
    for key, value in vars(profile.defaults).items():
        out.prose(f"    {key} = {'auto' if value is None else value}")


def _models(profile) -> dict[str, ModelSpec]:
    return {"target": profile.target} | ({"draft": profile.draft} if profile.draft is not None else {})


def _print_model(role: str, spec: ModelSpec) -> None:
    cached = store.model_path(spec)
    out.prose(f"  {role}: hf://{spec.label}")
    out.prose(f"    size: {format_size(spec.size)}   sha256: {spec.sha256 or 'not pinned'}")
    for mirror in spec.mirrors:
        parts = f"{mirror.packages[0]} .. {mirror.packages[-1]}" if len(mirror.packages) > 1 else mirror.packages[0]
        out.prose(f"    mirror: {mirror.kind} {parts} ({len(mirror.packages)} parts) version {mirror.version}")
    out.prose(f"    cache: {cached}{'' if cached.is_file() else ' (not downloaded)'}")
