"""Command groups that list something when called alone (``localspec history``, ``localspec profiles``),
with subcommands beside the list (``clear``, ``show``)."""

from __future__ import annotations

from collections.abc import Callable

import typer


def listing_group(help: str, listing: Callable[[bool], None]) -> typer.Typer:
    """A Typer group that runs ``listing(json_output)`` when no subcommand is given (``--json``: as JSON)."""
    app = typer.Typer(help=help, add_completion=False)

    @app.callback(invoke_without_command=True)
    def list_command(
        ctx: typer.Context,
        json_output: bool = typer.Option(False, "--json", help="Print the list as JSON."),
    ) -> None:
        if not ctx.invoked_subcommand:
            listing(json_output)

    list_command.__doc__ = listing.__doc__
    return app
