"""What every command shares for output: the two streams (results to stdout, progress and status to
stderr), the download progress bar, localspec's own status lines, and how sizes are written."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, ConsoleDimensions
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from localspec.store import cache as store

# Off a terminal (pipes, files, CI logs) tables and prose fit this width, as logs and diffs are read.
PIPE_WIDTH = 100


class _Console(Console):
    """A Rich console whose tables and prose (``prose``) fit the terminal, or PIPE_WIDTH where there is none.

    Plain ``print`` does not wrap (soft wrap), so answers and JSON reach a pipe byte for byte.
    """

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

    def prose(self, text: str, *, hang: int = 2, markup: bool = False) -> None:
        """``text`` wrapped at word boundaries to the console's width; lines after the first are indented ``hang``
        more than the text's own indent, and a word longer than a line (a path) is broken."""
        if markup:
            self.print(text, markup=True, soft_wrap=False, overflow="fold")
            return
        indent = len(text) - len(text.lstrip(" "))
        for line in textwrap.wrap(text, width=self.width, subsequent_indent=" " * (indent + hang), break_on_hyphens=False):
            self.print(line, markup=False, highlight=False)


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)


def add_columns(table: Table, names: tuple[str, ...], *, wrapping: tuple[str, ...], left: tuple[str, ...]) -> None:
    """Columns for a table of figures: figures never wrap, the ``wrapping`` columns (labels, prose) do, headers
    included, so the table fits PIPE_WIDTH even where a tiny model's figures run to six digits."""
    for name in names:
        wraps = name in wrapping
        narrowest = max(map(len, name.split())) if wraps else len(name)
        justify = "left" if name in left else "right"
        table.add_column(name, justify=justify, no_wrap=not wraps, overflow="fold", min_width=narrowest)


class _StatusLines(logging.Handler):
    """localspec's own log (``logging.getLogger("localspec...")``: the store's fallback to a mirror, say) as plain
    status lines on stderr; third-party libraries' logs stay off the terminal (see store/http.py)."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(record.getMessage(), markup=False, highlight=False)  # one line, however long: a log greps it


_log = logging.getLogger("localspec")
_log.addHandler(_StatusLines())
_log.propagate = False


@contextmanager
def rich_progress() -> Iterator[store.Progress]:
    """A Rich progress bar on stderr, driven by the store's ``progress(description, done, total)`` callback;
    nothing off a terminal (Rich would draw no bar there, only leave an empty line)."""
    if not err.is_terminal:
        yield lambda description, done, total: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        tasks: dict[str, int] = {}

        def update(description: str, done: int, total: int) -> None:
            if description not in tasks:
                tasks[description] = bar.add_task(description, total=total or None)
            bar.update(tasks[description], completed=done, total=total or None)

        yield update


def format_size(size: int | None) -> str:
    if size is None:
        return "?"
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"
