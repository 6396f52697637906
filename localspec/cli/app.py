"""The ``localspec`` command: registers each command module and maps known errors to one line."""

from __future__ import annotations

import click
import typer
from typer.core import TyperGroup

from localspec import __version__
from localspec.cli import commands
from localspec.cli.console import err
from localspec.errors import LocalspecError, PromptTooLong, debug_enabled


class _Group(TyperGroup):
    """Turns localspec's own errors into one line and an exit code; LOCALSPEC_DEBUG=1 shows tracebacks."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except LocalspecError as exc:
            if debug_enabled():
                raise
            fix = "; use a larger --ctx or a shorter prompt" if isinstance(exc, PromptTooLong) else ""
            err.print(f"[bold red]error:[/] {exc}{fix}", markup=True, highlight=False)
            ctx.exit(exc.exit_code)
        except KeyboardInterrupt:
            err.print("interrupted")
            ctx.exit(130)


app = typer.Typer(
    cls=_Group,
    name="localspec",
    help="Lossless speculative decoding for llama.cpp models on your own machine.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        print(f"localspec {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
) -> None:
    """Lossless speculative decoding for llama.cpp models on your own machine."""


commands.register(app)


def main() -> None:
    app()
