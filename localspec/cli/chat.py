"""``localspec chat``: a multi-turn conversation with the live view, slash commands, and a plain mode.

On a terminal the answer streams through ``localspec.tui.LiveView``; when stdin or stdout is not a
terminal (or with ``--no-tui``) turns are read from stdin, one per line, answers go to stdout and the
figures to stderr, so the same command works in pipes and CI.
"""

from __future__ import annotations

import json
import select
import sys
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from localspec.cli import options as o
from localspec.cli.console import err, out
from localspec.cli.interrupt import CtrlC
from localspec.conversation import Conversation
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.drafters.registry import check_method
from localspec.errors import LocalspecError, UsageError
from localspec.tui import LiveView, stats_table

DEFAULT_MAX_TOKENS = 1024
# After a line is read on a terminal, input arriving within this time is the rest of a paste.
PASTE_GRACE_S = 0.05
HELP = """\
/help              this list
/stats             the last answer's figures
/method M          none, draft, lookup, hybrid, mtp, eagle3, dflash or auto
/k N | /k auto     fixed draft length, or let the controller choose
/temp X            temperature (0 is greedy)
/system TEXT       set the system prompt (no text clears it)
/reset             forget the conversation
/save FILE         save the conversation as .json or .md
/colors            mark drafted and looked-up tokens, or not
/quit              exit (or Ctrl-D); Ctrl-C stops an answer
End a line with \\ to continue on the next one."""


@dataclass(frozen=True)
class Command:
    name: str
    arg: str | int | float | None = None


def _no_arg(name: str, rest: str) -> None:
    if rest:
        raise UsageError(f"/{name} takes no argument")


def _method_arg(name: str, rest: str) -> str:
    return check_method(rest, given_as="/method")


def _k_arg(name: str, rest: str) -> int | None:
    if rest == "auto":
        return None
    if not rest.isdigit() or int(rest) < 1:
        raise UsageError("/k needs a whole number of at least 1, or 'auto'")
    return int(rest)


def _temp_arg(name: str, rest: str) -> float:
    try:
        value = float(rest)
    except ValueError:
        value = -1.0
    if not value >= 0.0:  # also rejects nan
        raise UsageError("/temp needs a number of at least 0 (0 is greedy)")
    return value


def _text_arg(name: str, rest: str) -> str | None:
    return rest or None


def _path_arg(name: str, rest: str) -> str:
    if Path(rest).suffix.lower() not in (".json", ".md"):
        raise UsageError("/save needs a file name ending in .json or .md")
    return rest


_PARSERS: dict[str, Callable[[str, str], object]] = {
    "help": _no_arg,
    "stats": _no_arg,
    "method": _method_arg,
    "k": _k_arg,
    "temp": _temp_arg,
    "system": _text_arg,
    "reset": _no_arg,
    "save": _path_arg,
    "colors": _no_arg,
    "quit": _no_arg,
}


def parse_command(line: str) -> Command | None:
    """The slash command on ``line``, or None when the line is an ordinary turn.

    Raises:
        UsageError: an unknown command or a bad argument; the message says what is expected.
    """
    if not line.startswith("/"):
        return None
    name, _, rest = line[1:].partition(" ")
    if name not in _PARSERS:
        raise UsageError(f"unknown command /{name}; /help lists them")
    return Command(name, _PARSERS[name](name, rest.strip()))


def read_turn(next_line: Callable[[str], str], more_pending: Callable[[], bool] = lambda: False) -> str:
    """One turn: a line ending with a backslash continues on the next one, as does a pasted block.

    ``next_line(prompt)`` raises EOFError at the end of input; a turn cut short by it is still returned.
    """
    lines: list[str] = []
    line = next_line(">>> ")
    while line.endswith("\\") or more_pending():
        lines.append(line.removesuffix("\\"))
        try:
            line = next_line("... ")
        except EOFError:
            return "\n".join(lines)
    lines.append(line)
    return "\n".join(lines)


def _stdin_line(prompt: str) -> str:
    line = sys.stdin.readline()
    if not line:
        raise EOFError
    return line.rstrip("\r\n")


def _paste_pending() -> bool:
    """On a terminal, more input right after a line is the rest of a paste, not the user typing."""
    return bool(select.select([sys.stdin], [], [], PASTE_GRACE_S)[0])


class ChatSession:
    """The chat loop: turns go to the conversation, slash commands change the session's settings."""

    def __init__(
        self,
        conversation: Conversation,
        sampling: SamplingParams,
        *,
        max_tokens: int,
        view: LiveView | None,
        label: str,
    ) -> None:
        self.conversation = conversation
        self.decoder = conversation.decoder
        self.sampling = sampling
        self.max_tokens = max_tokens
        self.view = view
        self.label = label
        self.answered = False

    def loop(self, read: Callable[[], str]) -> None:
        """Until end of input or /quit; errors in a turn or a command are shown and the chat goes on."""
        while True:
            try:
                line = read()
            except EOFError:
                return
            except KeyboardInterrupt:
                if self.view is None:
                    return
                err.print("(Ctrl-D or /quit to exit)")
                continue
            try:
                command = parse_command(line.strip())
                if command is None:
                    if line.strip():
                        self.answer(line)
                elif not self.handle(command):
                    return
            except LocalspecError as exc:
                err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)

    def answer(self, text: str) -> None:
        """Stream one answer; Ctrl-C stops it, and the partial answer stays in the conversation."""
        view = self.view
        with CtrlC() as ctrl_c:

            def prefill_progress(done: int, total: int) -> None:
                ctrl_c.raise_if_pressed()  # a long prompt is read in chunks: stop between them
                if view is not None:
                    view.prefill_progress(done, total)

            pieces = self.conversation.ask(
                text,
                max_tokens=self.max_tokens,
                sampling=self.sampling,
                on_dropped=lambda n: err.print(f"(dropped the {n} oldest turn(s) to fit the context window)"),
                prefill_progress=prefill_progress,
            )
            # closing(): the decoder rolls its caches back as soon as we stop reading, not at garbage collection.
            with closing(pieces):
                try:
                    if view is not None:
                        view.stream(ctrl_c.until_pressed(pieces))
                    else:
                        for piece in ctrl_c.until_pressed(pieces):
                            sys.stdout.write(piece.text)
                            sys.stdout.flush()
                except KeyboardInterrupt:
                    pass
        if view is None:
            sys.stdout.write("\n")
            sys.stdout.flush()
        self.answered = True
        err.print(self.decoder.stats.summary_line() + (" | interrupted" if ctrl_c.pressed else ""), highlight=False)

    def handle(self, command: Command) -> bool:
        """Carry out a slash command; False means exit."""
        if command.name == "quit":
            return False
        getattr(self, f"_{command.name}")(command.arg)
        return True

    def _help(self, _: None) -> None:
        err.print(HELP, highlight=False)

    def _stats(self, _: None) -> None:
        if not self.answered:
            err.print("no answer yet")
            return
        err.print(stats_table(self.decoder.stats))

    def _method(self, method: str) -> None:
        self.decoder.controller.configure(method, self.decoder.controller.draft_len)
        self._settings()

    def _k(self, draft_len: int | None) -> None:
        self.decoder.controller.configure(self.decoder.controller.method, draft_len)
        self._settings()

    def _temp(self, temperature: float) -> None:
        self.sampling = replace(self.sampling, temperature=temperature)
        self._settings()

    def _system(self, text: str | None) -> None:
        self.conversation.system = text
        err.print("system prompt set" if text else "system prompt cleared")

    def _reset(self, _: None) -> None:
        self.conversation.reset()
        err.print("conversation cleared")

    def _save(self, path: str) -> None:
        target = Path(path).expanduser()
        try:
            target.write_text(self._export(target.suffix.lower()), encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write {target}: {exc.strerror or exc}") from exc
        err.print(f"saved {len(self.conversation.messages)} messages to {target}")

    def _export(self, suffix: str) -> str:
        # Only the conversation and the model's name: nothing from the environment (tokens, paths).
        system, messages = self.conversation.system, self.conversation.messages
        if suffix == ".json":
            return json.dumps({"model": self.label, "system": system, "messages": messages}, indent=2) + "\n"
        blocks = [f"# Chat with {self.label}"]
        if system:
            blocks.append(f"## system\n\n{system}")
        blocks += [f"## {m['role']}\n\n{m['content']}" for m in messages]
        return "\n\n".join(blocks) + "\n"

    def _colors(self, _: None) -> None:
        if self.view is None:
            err.print("colors only apply to the live view")
            return
        self.view.colors = not self.view.colors
        err.print(f"colors {'on' if self.view.colors else 'off'}")

    def _settings(self) -> None:
        controller = self.decoder.controller
        k = "auto" if controller.draft_len is None else controller.draft_len
        err.print(f"method {controller.method}, k {k}, temperature {self.sampling.temperature:g}")


@o.generation_options()
def chat_command(
    max_tokens: o.MaxTokensOpt = DEFAULT_MAX_TOKENS,
    system: Annotated[Optional[str], typer.Option("--system", help="System prompt.")] = None,
    no_tui: Annotated[bool, typer.Option("--no-tui", help="Plain text even on a terminal.")] = False,
    *,
    generation: o.GenerationOptions,
) -> None:
    """Chat with speculative decoding; /help lists the commands. Reads turns from stdin when piped."""
    pair, decoder, sampling = generation.open()
    live = not no_tui and sys.stdin.isatty() and sys.stdout.isatty()
    view = LiveView(out, decoder) if live else None
    session = ChatSession(
        Conversation(decoder, system=system), sampling, max_tokens=max_tokens, view=view, label=pair.label
    )
    if live:
        err.print(f"chatting with {pair.label} (method {decoder.controller.method}); /help for commands, Ctrl-D to quit")
        session.loop(lambda: read_turn(input, _paste_pending))
    else:
        session.loop(lambda: read_turn(_stdin_line))
