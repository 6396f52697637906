"""``localspec history``: what the answer history (suffix decoding) holds; ``localspec history clear`` empties it."""

from __future__ import annotations

import json

from rich.table import Table

from localspec import paths
from localspec.cli.console import err, format_size, out
from localspec.cli.listing import listing_group
from localspec.engine.drafters.suffix_index import SEPARATOR
from localspec.engine.persist import history


def _list(json_output: bool) -> None:
    """List the history files: one per tokenizer, with answers, tokens and size."""
    directory = paths.history_dir()
    rows = []
    for path in sorted(directory.glob("*.bin")) if directory.is_dir() else []:
        tokens = history.read_tokens(path)
        answers = int((tokens == SEPARATOR).sum())
        rows.append({"tokenizer": path.stem, "answers": answers, "tokens": len(tokens) - answers,
                     "bytes": path.stat().st_size})
    if json_output:
        out.print(json.dumps({"directory": str(directory), "files": rows}, indent=2), markup=False, highlight=False)
        return
    out.prose(f"history: {directory} (off: --no-history, or 'history = false' in a profile's defaults)")
    if not rows:
        out.print("  empty")
        return
    table = Table(box=None, pad_edge=False)
    for column in ("tokenizer", "answers", "tokens", "size"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["tokenizer"], str(row["answers"]), str(row["tokens"]), format_size(row["bytes"]))
    out.print(table)


app = listing_group("Earlier answers kept for suffix decoding: list them per tokenizer, or clear them.", _list)


@app.command("clear")
def clear_command() -> None:
    """Delete every stored answer (all tokenizers)."""
    directory = paths.history_dir()
    removed = history.clear(directory) if directory.is_dir() else 0
    err.prose(f"cleared {removed} history file(s) in {directory}")
