"""``localspec check``: can TARGET and DRAFT be paired? Reads GGUF headers only, never the weights."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from localspec.cli.console import out
from localspec.errors import StoreError, UsageError
from localspec.gguf.compat import Report
from localspec.profiles import load_profile
from localspec.session import ModelRef, model_report, pair_report

EXIT_INCOMPATIBLE = 1
_STYLES = {"ok": "green", "warning": "yellow", "error": "bold red", "security": "bold magenta"}
_VERDICT_STYLES = {"compatible": "bold green", "compatible with warnings": "bold yellow", "incompatible": "bold red"}


def check_command(
    target: Optional[str] = typer.Argument(None, help="Target model: a local GGUF path or hf://OWNER/NAME/FILE.gguf"),
    draft: Optional[str] = typer.Argument(None, help="Draft model: a local GGUF path or hf://OWNER/NAME/FILE.gguf"),
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="Check a profile's target and draft."),
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Compare tokenizers and chat templates; name each model's drafting heads (TARGET alone: those only).
    Exit 0 compatible, 1 incompatible, 2 bad or unreachable input."""
    target_ref, draft_ref = _refs(target, draft, profile)
    try:
        report = pair_report(target_ref, draft_ref) if draft_ref is not None else model_report(target_ref)
    except StoreError as exc:
        # An unreachable or unknown model is an input problem here: nothing was compared.
        raise UsageError(str(exc)) from exc
    if json_output:
        out.print(json.dumps(report.to_dict(), indent=2), markup=False, highlight=False)
    else:
        _print_report(report)
    if not report.compatible:
        raise typer.Exit(EXIT_INCOMPATIBLE)


def _refs(target: str | None, draft: str | None, profile: str | None) -> tuple[ModelRef, ModelRef | None]:
    if profile:
        if target or draft:
            raise UsageError("give either TARGET DRAFT or --profile NAME, not both")
        chosen = load_profile(profile)
        return chosen.target, chosen.draft
    if not target:
        raise UsageError("give TARGET [DRAFT] (local GGUF paths or hf://OWNER/NAME/FILE.gguf), or --profile NAME")
    return target, draft


def _print_report(report: Report) -> None:
    headline = Text(report.verdict, style=_VERDICT_STYLES[report.verdict])
    if report.first_reason:
        headline.append(f": {report.first_reason}")
    out.print(headline, soft_wrap=False)
    table = Table(show_header=True, header_style="bold", expand=False)
    for column in ("severity", "check", "finding", "detail"):
        table.add_column(column, overflow="fold")
    for finding in report.findings:
        table.add_row(
            Text(finding.severity, style=_STYLES[finding.severity]),
            Text(finding.code),
            Text(finding.title),
            Text(finding.detail),
        )
    out.print(table)
