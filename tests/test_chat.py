"""``localspec chat`` and the live view: command parsing, plain mode through stdin, Ctrl-C, a real terminal."""

from __future__ import annotations

import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from localspec.cli.app import app
from localspec.cli.chat import ChatSession, Command, parse_command, read_turn
from localspec.conversation import Conversation
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.decoding.text import Step, TextPiece, stream_text
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.llama.model import Model
from localspec.engine.persist.history import HistoryStore
from localspec.errors import UsageError
from localspec.session import ModelOptions, Pair, open_decoder
from localspec.tui import SOURCE_STYLES, LiveView, sparkline

REPO = Path(__file__).resolve().parent.parent


def chat(tiny_target: Path, tiny_draft: Path, stdin: str, *args: str):
    runner = CliRunner()
    command = ["chat", "--target", str(tiny_target), "--draft", str(tiny_draft), "-n", "24", "--threads", "1", *args]
    return runner.invoke(app, command, input=stdin)


def make_decoder(target: Path, draft: Path | None = None, *, method: str = "hybrid") -> SpeculativeDecoder:
    # One thread: the tiny models gain nothing from more, and a busy machine slows llama.cpp's thread sync a lot.
    proposer = DraftModelDrafter(lambda: Model(draft, n_ctx=1024, n_threads=1)) if draft else None
    return SpeculativeDecoder(Model(target, n_ctx=1024, n_threads=1), draft=proposer, method=method)


# -- parsing -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "line, command",
    [
        ("hello /k 3", None),
        ("/help", Command("help")),
        ("/stats", Command("stats")),
        ("/method lookup", Command("method", "lookup")),
        ("/k 5", Command("k", 5)),
        ("/k auto", Command("k", None)),
        ("/temp 0.7", Command("temp", 0.7)),
        ("/system  Be brief.  ", Command("system", "Be brief.")),
        ("/system", Command("system", None)),
        ("/save chat.md", Command("save", "chat.md")),
        ("/save out/Chat.JSON", Command("save", "out/Chat.JSON")),
        ("/reset", Command("reset")),
        ("/colors", Command("colors")),
        ("/quit", Command("quit")),
    ],
)
def test_parse_command(line, command):
    assert parse_command(line) == command


@pytest.mark.parametrize(
    "line, message",
    [
        ("/nope", "unknown command /nope"),
        ("/method fast", "one of none, lookup"),
        ("/k 0", "at least 1"),
        ("/k two", "at least 1"),
        ("/temp -1", "at least 0"),
        ("/temp nan", "at least 0"),
        ("/save chat.txt", ".json or .md"),
        ("/save", ".json or .md"),
        ("/reset now", "takes no argument"),
    ],
)
def test_malformed_commands_say_what_is_expected(line, message):
    with pytest.raises(UsageError, match=message):
        parse_command(line)


def test_read_turn_joins_backslash_continuations_and_pastes():
    lines = iter(["def f(x):\\", "    return x", "next"])
    assert read_turn(lambda prompt: next(lines)) == "def f(x):\n    return x"
    pasted = iter(["a", "b", "c"])
    pending = iter([True, True, False])
    assert read_turn(lambda prompt: next(pasted), lambda: next(pending)) == "a\nb\nc"


def test_read_turn_keeps_a_continuation_cut_by_end_of_input():
    lines = iter(["first\\"])

    def next_line(prompt: str) -> str:
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    assert read_turn(next_line) == "first"
    with pytest.raises(EOFError):
        read_turn(next_line)


# -- plain mode through stdin --------------------------------------------------------------------
def test_plain_mode_answers_each_line_with_figures_on_stderr(tiny_target, tiny_draft):
    result = chat(tiny_target, tiny_draft, "hello world\ndef x\\\n= x\n")
    assert result.exit_code == 0, result.output
    # The same two turns (the second joined across the backslash) through the target alone.
    alone = Conversation(make_decoder(tiny_target, method="none"))
    expected = ["".join(p.text for p in alone.ask(turn, max_tokens=24)) for turn in ("hello world", "def x\n= x")]
    assert result.stdout == expected[0] + "\n" + expected[1] + "\n"
    assert result.stderr.count("tok/s") == 2 and "target passes" in result.stderr


def test_method_none_gives_the_target_alone_output(tiny_target, tiny_draft):
    turns = "hello world\n{switch}def x = x\n"
    alone = chat(tiny_target, tiny_draft, turns.format(switch=""), "--method", "none")
    switched = chat(tiny_target, tiny_draft, turns.format(switch="/method none\n"), "--method", "hybrid")
    assert alone.exit_code == switched.exit_code == 0, switched.output
    assert switched.stdout == alone.stdout
    first, second = [line for line in switched.stderr.splitlines() if "tok/s" in line]
    assert "accepted" in first  # hybrid drafted in the first turn ...
    assert "accepted" not in second and "24 tokens | " in second and "| 24 target passes" in second  # ... not after


def test_commands_in_plain_mode(tiny_target, tiny_draft, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    saved = tmp_path / "chat.json"
    stdin = f"/system Be brief.\n/k 3\n/temp 0\nhello\n/stats\n/bogus\n/save {saved}\n/save {tmp_path}/c.md\n/reset\n/quit\nnot read\n"
    result = chat(tiny_target, tiny_draft, stdin)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == 1 and result.stderr.count("tok/s") == 1  # /quit stopped before "not read"
    assert "method auto, k 3" in result.stderr and "acceptance_rate" in result.stderr
    assert "unknown command /bogus" in result.stderr
    data = json.loads(saved.read_text())
    assert data["system"] == "Be brief." and [m["role"] for m in data["messages"]] == ["user", "assistant"]
    markdown = (tmp_path / "c.md").read_text()
    assert "## system\n\nBe brief." in markdown and "## user\n\nhello" in markdown
    assert "hf_secret" not in saved.read_text() + markdown


# -- Ctrl-C --------------------------------------------------------------------------------------
class _CtrlCOnWrite(io.StringIO):
    """Sends this process a real SIGINT on the n-th write, as Ctrl-C in the middle of an answer would."""

    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after

    def write(self, text: str) -> int:
        self.after -= 1
        if self.after == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return super().write(text)


def test_ctrl_c_stops_the_answer_and_the_next_turn_equals_a_fresh_session(tiny_target, tiny_draft, monkeypatch, capsys):
    session = ChatSession(
        Conversation(make_decoder(tiny_target, tiny_draft)), SamplingParams(), max_tokens=40, view=None, label="tiny"
    )
    monkeypatch.setattr(sys, "stdout", _CtrlCOnWrite(after=6))
    session.answer("hello world")
    partial = session.conversation.messages[-1]["content"]
    assert "interrupted" in capsys.readouterr().err
    assert partial and session.decoder.stats.generated_tokens < 40

    monkeypatch.setattr(sys, "stdout", io.StringIO())
    session.answer("def x")
    after_interrupt = sys.stdout.getvalue()

    fresh = Conversation(make_decoder(tiny_target, method="none"))
    fresh.messages = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": partial}]
    expected = "".join(piece.text for piece in fresh.ask("def x", max_tokens=40))
    assert after_interrupt == expected + "\n"


# -- the live view -------------------------------------------------------------------------------
def test_sparkline_scales_zero_to_one():
    assert sparkline([0.0, 0.5, 1.0, 2.0]) == " ▄██"


def test_live_view_streams_the_text_and_shows_the_status(tiny_target, tiny_draft):
    decoder = make_decoder(tiny_target, tiny_draft)
    screen = io.StringIO()
    view = LiveView(Console(file=screen, force_terminal=True, width=100), decoder)
    prompt = decoder.target.tokenize("hello world def x", add_bos=True)
    pieces = list(stream_text(decoder.target, decoder.generate(prompt, max_tokens=60)))
    text = view.stream(pieces)
    assert text == "".join(p.text for p in pieces)
    assert "tok/s now" in screen.getvalue() and "accepted" in screen.getvalue()
    status = view.status_text(decoder.stats, 12.5).plain
    assert "12.5 tok/s now" in status and "by position 1▕" in status


def test_live_view_prints_completed_lines_once(tiny_target):
    decoder = make_decoder(tiny_target, method="none")
    screen = io.StringIO()
    view = LiveView(Console(file=screen, force_terminal=False, width=100), decoder, colors=False, min_interval=0)
    step = Step([0], ["target"], "none", 0, 0)
    view.stream([TextPiece(t, "target", step) for t in ("one\ntw", "o\n", "three")])
    assert screen.getvalue().count("one") == 1 and "one\ntwo\nthree\n" in screen.getvalue()


@pytest.mark.parametrize("source", list(SOURCE_STYLES))
def test_live_view_shows_every_token_source(tiny_target, source):
    """A constrained answer's grammar-forced tokens too (the live view once raised KeyError on them)."""
    decoder = make_decoder(tiny_target, method="none")
    screen = io.StringIO()
    view = LiveView(Console(file=screen, force_terminal=True, width=100), decoder, min_interval=0)
    step = Step([0], [source], source, 1, 1)
    assert view.stream([TextPiece("forced", source, step)]) == "forced"
    assert source in view.status_text(decoder.stats, 1.0).plain


def test_live_view_colours_tokens_drafted_from_the_answer_history(tiny_target):
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=1024, n_threads=1), history=HistoryStore(None))
    prompt = decoder.target.tokenize("hello world def x", add_bos=True)
    for _ in range(2):  # the first answer fills the history (and the controller's costs), the second drafts from it
        screen = io.StringIO()
        view = LiveView(Console(file=screen, force_terminal=True, width=100), decoder)
        pieces = list(stream_text(decoder.target, decoder.generate(prompt, max_tokens=40)))
        view.stream(pieces)
    assert any(piece.source == "suffix" for piece in pieces)
    assert "suffix" in view.status_text(decoder.stats, 1.0).plain


# -- a real terminal -----------------------------------------------------------------------------
def _tmux() -> str:
    tmux = shutil.which("tmux")
    if tmux is None:
        pytest.fail("tmux is needed for the terminal test: apt-get install -y tmux (scripts/setup does it)")
    return tmux


class Terminal:
    """A detached tmux session of a fixed size running one command."""

    def __init__(self, tmux: str, command: str, name: str) -> None:
        self.tmux, self.name = tmux, name
        subprocess.run([tmux, "kill-session", "-t", name], capture_output=True)
        # `sleep` keeps the pane after the command exits, so the last screen can still be read.
        subprocess.run(
            [tmux, "new-session", "-d", "-s", name, "-x", "120", "-y", "40", f'{command}; echo "[exit $?]"; sleep 60'], check=True
        )

    def keys(self, *keys: str) -> None:
        subprocess.run([self.tmux, "send-keys", "-t", self.name, *keys], check=True)

    def screen(self) -> str:
        return subprocess.run(
            [self.tmux, "capture-pane", "-p", "-t", self.name], check=True, capture_output=True, text=True
        ).stdout

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        pytest.fail(f"{text!r} did not appear; the screen was:\n{self.screen()}")

    def close(self) -> None:
        subprocess.run([self.tmux, "kill-session", "-t", self.name], capture_output=True)


@pytest.fixture
def terminal(request):
    tmux = _tmux()
    opened: list[Terminal] = []

    def open_terminal(command: str) -> Terminal:
        opened.append(Terminal(tmux, command, f"localspec-test-{len(opened)}-{request.node.name}"[:60]))
        return opened[-1]

    yield open_terminal
    for term in opened:
        term.close()


def test_chat_in_a_terminal_shows_the_status_and_ctrl_c_stops_an_answer(tiny_target, tiny_draft, terminal, localspec_home):
    # A long context and budget make the tiny model answer for many seconds, time enough to look and interrupt.
    command = (
        f"LOCALSPEC_HOME={localspec_home} {shlex.quote(str(REPO / '.venv/bin/localspec'))} chat "
        f"--target {tiny_target} --draft {tiny_draft} --method hybrid --ctx 16384 -n 16000 --threads 1"
    )
    term = terminal(command)
    term.wait_for("/help for commands")
    term.keys("hello world def x", "Enter")
    live = term.wait_for("tok/s now")
    assert "accepted" in live and "tok/pass" in live and "hybrid" in live
    print("live view:\n" + live)
    term.keys("C-c")
    stopped = term.wait_for("interrupted")
    assert stopped.rstrip().endswith(">>>"), stopped  # the chat goes on
    term.keys("/method none", "Enter")
    term.wait_for("method none, k auto")
    term.keys("C-d")
    term.wait_for("[exit 0]")


# -- the real pair -------------------------------------------------------------------------------
FIRST_TURN = (
    "Write a Python function word_counts(text) that returns a dict mapping each lowercase word to how often "
    "it occurs. Reply with the code only."
)
SECOND_TURN = "Repeat that function exactly, but rename it to count_words. Reply with the code only."


@pytest.mark.real
def test_second_turn_repeating_code_is_drafted_by_lookup(qwen_pair, capsys):
    target, draft = qwen_pair
    decoder = open_decoder(Pair(target, draft, "qwen-coder-1.5b"), ModelOptions(n_ctx=4096), method="lookup")
    session = ChatSession(Conversation(decoder), SamplingParams(), max_tokens=160, view=None, label="qwen")
    turns = []
    for text in (FIRST_TURN, SECOND_TURN):
        session.answer(text)
        turns.append(decoder.stats)
    answers = capsys.readouterr().out
    rates = [s.accepted_by_source.get("lookup", 0) / max(1, s.drafted_by_source.get("lookup", 0)) for s in turns]
    with capsys.disabled():
        for i, s in enumerate(turns, 1):
            print(
                f"\nturn {i}: lookup accepted {s.accepted_by_source.get('lookup', 0)}/{s.drafted_by_source.get('lookup', 0)}"
                f" ({rates[i - 1]:.0%}), {s.mean_accepted_length:.2f} tok/pass, {s.decode_tok_per_s:.1f} tok/s,"
                f" prefill {s.prefill_tokens} of {s.prompt_tokens} prompt tokens"
            )
    assert "count_words" in answers
    assert rates[1] > rates[0]
    assert turns[1].prefill_tokens < turns[1].prompt_tokens / 2  # the first turn came from the KV cache
