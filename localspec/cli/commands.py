"""The list of commands; each module owns one command (or one command group)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    pass
