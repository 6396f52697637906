"""``localspec history``: what the answer history (suffix decoding) holds; ``localspec history clear`` empties it."""

from __future__ import annotations

import typer
from rich.table import Table

from localspec import paths
from localspec.cli.console import err, format_size, out
from localspec.engine import history
from localspec.engine.suffix import SEPARATOR

app = typer.Typer(
    help="Earlier answers kept for suffix decoding: list them per tokenizer, or clear them.", add_completion=False
)


@app.callback(invoke_without_command=True)
def list_command(ctx: typer.Context) -> None:
    """List the history files: one per tokenizer, with answers, tokens and size."""
    if ctx.invoked_subcommand:
        return
    directory = paths.history_dir()
    files = sorted(directory.glob("*.bin")) if directory.is_dir() else []
    out.prose(f"history: {directory} (off: --no-history, or 'history = false' in a profile's defaults)")
    if not files:
        out.print("  empty")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("tokenizer", "answers", "tokens", "size"):
        table.add_column(column)
    for path in files:
        tokens = history.read_tokens(path)
        answers = int((tokens == SEPARATOR).sum())
        table.add_row(path.stem, str(answers), str(len(tokens) - answers), format_size(path.stat().st_size))
    out.print(table)


@app.command("clear")
def clear_command() -> None:
    """Delete every stored answer (all tokenizers)."""
    directory = paths.history_dir()
    removed = history.clear(directory) if directory.is_dir() else 0
    err.prose(f"cleared {removed} history file(s) in {directory}")
