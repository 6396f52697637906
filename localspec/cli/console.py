"""What every command shares for output: the two streams (results to stdout, progress and status to
stderr), the download progress bar, and how sizes are written."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console, ConsoleDimensions
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from localspec import store

# Off a terminal (pipes, files, CI logs) nothing needs to fit a screen: tables take the width they need.
UNBOUNDED_WIDTH = 10_000


class _Console(Console):
    """A Rich console that fits tables to the terminal, and does not cut them where there is none."""

    @property
    def size(self) -> ConsoleDimensions:
        size = Console.size.fget(self)
        return size if self.is_terminal else ConsoleDimensions(UNBOUNDED_WIDTH, size.height)


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)


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


def format_size(size: int | None) -> str:
    if size is None:
        return "?"
    return f"{size / 1e9:.2f} GB" if size >= 1e9 else f"{size / 1e6:.0f} MB"
