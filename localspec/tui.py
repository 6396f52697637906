"""The live terminal view of an answer: streaming text coloured by provenance and a status area.

Completed lines are printed above the live region and leave it, so each refresh renders only the
current line and the status: the cost of a refresh does not grow with the answer. Refreshes are
driven by the stream itself (no refresh thread) and throttled, so the view cannot slow the decoder
by more than a render every ``min_interval`` seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from time import perf_counter

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.stats import GenerationStats
from localspec.engine.decoding.text import TextPiece
from localspec.engine.drafters.base import TARGET, TARGET_ALONE
from localspec.engine.drafters.registry import DRAFTERS
from localspec.gguf.memory import MemoryKind

DEFAULT_MIN_INTERVAL = 0.1  # at most ~10 refreshes per second
# How each source's tokens are coloured (the legend names them by their source).
SOURCE_STYLES = {TARGET: "", **{cls.source: cls.style for cls in DRAFTERS}}
BARS = " ▁▂▃▄▅▆▇█"
MAX_CHART_POSITIONS = 24
LIVE_ROWS = 3  # rows of an unfinished line kept in the live region
# "Now" tok/s covers about this much decode time, so it follows the text without flickering.
RATE_WINDOW_S = 1.0
# Prompts longer than this get a progress bar while they are read (~5 s at 100 tok/s on a CPU).
LONG_PROMPT_TOKENS = 512


def sparkline(values: Iterable[float]) -> str:
    """One block character per value in [0, 1]: a bar chart one line high."""
    return "".join(BARS[round(max(0.0, min(1.0, v)) * (len(BARS) - 1))] for v in values)


class _Rate:
    """Recent tokens per second of decode time, from (tokens, decode seconds) samples of the stats."""

    def __init__(self) -> None:
        self._samples: deque[tuple[int, float]] = deque()

    def update(self, stats: GenerationStats) -> float:
        now = (stats.generated_tokens, stats.decode_s)
        self._samples.append(now)
        while len(self._samples) > 2 and now[1] - self._samples[1][1] >= RATE_WINDOW_S:
            self._samples.popleft()
        tokens, seconds = now[0] - self._samples[0][0], now[1] - self._samples[0][1]
        return tokens / seconds if seconds > 0 else stats.decode_tok_per_s


class PrefillBar:
    """A ``prefill_progress`` callback: a transient bar on a terminal while a long prompt is read.

    Short prompts and pipes get nothing. Use it in a ``with`` block, so an error mid-prompt removes the bar.
    """

    def __init__(self, console: Console, *, min_tokens: int = LONG_PROMPT_TOKENS) -> None:
        self.console = console
        self.min_tokens = min_tokens
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def __call__(self, done: int, total: int) -> None:
        if total <= self.min_tokens or not self.console.is_terminal:
            return
        if self._bar is None:
            columns = (TextColumn("reading the prompt"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
            self._bar = Progress(*columns, console=self.console, transient=True)
            self._bar.start()
            self._task = self._bar.add_task("prefill", total=total)
        self._bar.update(self._task, completed=done, refresh=True)
        if done >= total:
            self.close()  # gone before the answer streams on the same terminal

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def __enter__(self) -> PrefillBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LiveView:
    """Shows answers from ``decoder`` live on ``console``; ``colors`` marks drafted and looked-up tokens."""

    def __init__(
        self,
        console: Console,
        decoder: SpeculativeDecoder,
        *,
        colors: bool = True,
        min_interval: float = DEFAULT_MIN_INTERVAL,
    ) -> None:
        self.console = console
        self.decoder = decoder
        self.colors = colors
        self.min_interval = min_interval
        self._line = Text()
        self._status = Text()
        self._live: Live | None = None
        self._last_step: tuple[str, int] = (TARGET_ALONE, 0)

    def __rich__(self) -> Group:
        return Group(self._line, self._status)

    def stream(self, pieces: Iterable[TextPiece]) -> str:
        """Show ``pieces`` as they arrive; returns the whole text. The status area vanishes at the end."""
        self._line, self._status, self._last_step = Text(), Text(), (TARGET_ALONE, 0)
        rate = _Rate()
        parts: list[str] = []
        last_refresh = 0.0
        with Live(self, console=self.console, auto_refresh=False, transient=True) as live:
            self._live = live
            try:
                for piece in pieces:
                    parts.append(piece.text)
                    self._line.append(piece.text, SOURCE_STYLES[piece.source] if self.colors else "")
                    self._last_step = (piece.step.source, piece.step.drafted)
                    now = perf_counter()
                    if now - last_refresh >= self.min_interval:
                        last_refresh = now
                        self._refresh(rate)
            finally:
                self._flush_lines(final=True)
                self._live = None
        return "".join(parts)

    def prefill_progress(self, done: int, total: int) -> None:
        """A ``prefill_progress`` callback for the decoder: shows how much of a long prompt is read."""
        if self._live is not None:
            self._status = Text(f"reading the prompt: {done}/{total} tokens", style="dim")
            self._live.refresh()

    def _refresh(self, rate: _Rate) -> None:
        stats = self.decoder.stats
        self._status = self.status_text(stats, rate.update(stats))
        # Printing finished lines re-renders the live region too; refresh only if nothing was printed.
        if not self._flush_lines(final=False):
            self._live.refresh()

    def _flush_lines(self, *, final: bool) -> bool:
        """Print finished lines above the live region (all of them when ``final``); returns whether any were.

        A line that has not ended yet but fills several rows gives up its finished rows too, so the live
        region, and the cost of a refresh, stays small even for an answer without newlines.
        """
        lines = self._line.split("\n", allow_blank=True)
        if final:
            done, self._line = (lines if lines[-1].plain else lines[:-1]), Text()
        else:
            done, self._line = lines[:-1], lines[-1]
            width = self.console.width
            if self._line.cell_len > LIVE_ROWS * width:
                rows = self._line.wrap(self.console, width)
                done, self._line = [*done, *rows[:-1]], rows[-1]
        if done:
            # Wrapped by Rich like the live region, so a line does not jump when it is printed.
            self.console.print(Text("\n").join(done), soft_wrap=False)
        return bool(done)

    def status_text(self, stats: GenerationStats, current_rate: float) -> Text:
        """The status area: speed, acceptance, the controller's choice, and acceptance by draft position."""
        method, k = self._last_step
        text = Text(style="dim")
        text.append(f"─ {self.decoder.controller.method}  ")
        text.append(f"{current_rate:5.1f} tok/s now", style="bold")
        text.append(f" · {stats.decode_tok_per_s:5.1f} avg")
        text.append(f" · accepted {stats.acceptance_rate:4.0%} · {stats.mean_accepted_length:.2f} tok/pass")
        text.append(f" · k {k} ({method})" if k else " · k 0 (target alone)")
        text.append(f" · {stats.generated_tokens} tok · {stats.kernels} kernels")
        text.append(f"\n  {stats.controller_note}")
        if stats.memory_kind != MemoryKind.KV:
            # A recurrent state rolls back at a cost, or not at all: say which.
            text.append(f"\n  memory {stats.memory}")
            if stats.replayed_tokens:
                text.append(f" · {stats.replayed_tokens} tokens replayed")
        positions = stats.per_position_acceptance[:MAX_CHART_POSITIONS]
        if positions:
            text.append(f"\n  by position 1▕{sparkline(positions)}▏{len(positions)}  ")
            text.append("  ".join(f"{i + 1}:{p:.0%}" for i, p in enumerate(positions[:3])))
        if self.colors:
            text.append("\n ")
            for source, style in SOURCE_STYLES.items():
                text.append(f" {source}", style=style or "default")
        return text


def stats_table(stats: GenerationStats) -> Table:
    """Every figure of one answer, from the same ``to_dict`` that ``run --json`` prints."""
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    for key, value in _flatten(stats.to_dict()):
        table.add_row(key, str(value))
    return table


def _flatten(figures: dict, prefix: str = "") -> list[tuple[str, object]]:
    rows: list[tuple[str, object]] = []
    for key, value in figures.items():
        if isinstance(value, dict) and value:
            rows += _flatten(value, f"{prefix}{key}.")
        else:
            rows.append((f"{prefix}{key}", value))
    return rows
