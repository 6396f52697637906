"""Sessions that outgrow the context: dropped turns keep answers exact, too-long prompts fail first, 8k prompts work."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from localspec.cli import run as run_module
from localspec.cli.app import app
from localspec.conversation import Conversation
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.llama.model import Model
from localspec.errors import ContextFullError
from localspec.tui import PrefillBar

CTX = 256
MAX_TOKENS = 24
SYSTEM = "Be brief."
# Tiny-model prompts: mostly one token per letter, so each turn takes some 60-80 tokens with its answer.
TURNS = [
    "hello world the code",
    "def return x = x + x",
    "print hello world again",
    "the code and the world",
    "return x + the world",
    "def hello print x",
    "world code return",
]


def decoder(target: Path, draft: Path | None = None) -> SpeculativeDecoder:
    proposer = DraftModelDrafter(lambda: Model(draft, n_ctx=CTX, n_threads=1)) if draft else None
    method = "hybrid" if draft else "none"
    return SpeculativeDecoder(Model(target, n_ctx=CTX, n_threads=1), draft=proposer, method=method)


def answer(conversation: Conversation, text: str, **kwargs) -> str:
    return "".join(piece.text for piece in conversation.ask(text, max_tokens=MAX_TOKENS, **kwargs))


def test_a_chat_past_the_context_drops_old_turns_and_answers_like_a_fresh_session(tiny_target, tiny_draft):
    chat = Conversation(decoder(tiny_target, tiny_draft), system=SYSTEM)
    notices: list[int] = []
    for text in TURNS:
        answered = answer(chat, text, on_dropped=notices.append)
        retained = chat.messages[:-2]  # what the model saw before this turn, after any dropping
        assert chat.messages[-2:] == [{"role": "user", "content": text}, {"role": "assistant", "content": answered}]
        # A fresh session, target alone, given only the retained turns, answers the same (greedy).
        fresh = Conversation(decoder(tiny_target), system=SYSTEM)
        fresh.messages = list(retained)
        assert answer(fresh, text) == answered
        assert fresh.dropped_turns == 0
    assert notices and sum(notices) == chat.dropped_turns >= 2
    assert chat.messages[0]["content"] != TURNS[0]  # the oldest turns are gone; the system prompt is kept apart
    assert chat.system == SYSTEM


def chat_cli(target: Path, draft: Path, stdin: str):
    args = ["chat", "--target", target, "--draft", draft, "--ctx", CTX, "-n", MAX_TOKENS, "--threads", 1]
    return CliRunner().invoke(app, [str(a) for a in args], input=stdin)


def test_chat_plain_mode_tells_the_user_when_turns_are_dropped(tiny_target, tiny_draft):
    result = chat_cli(tiny_target, tiny_draft, "\n".join(TURNS) + "\n")
    assert result.exit_code == 0, result.output
    assert result.stdout.count("\n") == len(TURNS)  # not splitlines(): answers may hold \x1d and the like
    notices = [line for line in result.stderr.splitlines() if line.startswith("(dropped the")]
    assert notices and all("oldest turn(s) to fit the context window" in line for line in notices)


def long_text(tokens: int) -> str:
    # Letters separated by spaces: about one token each in the tiny vocabulary.
    return " ".join("abcdefghijklmnopqrstuvwxyz"[i % 26] for i in range(tokens))


def test_a_turn_that_can_never_fit_leaves_the_conversation_unchanged(tiny_target):
    chat = Conversation(decoder(tiny_target), system=SYSTEM)
    for text in TURNS[:3]:
        answer(chat, text)
    before, dropped = [dict(m) for m in chat.messages], chat.dropped_turns
    with pytest.raises(ContextFullError, match="context window is 256"):
        answer(chat, long_text(2 * CTX))
    assert chat.messages == before and chat.dropped_turns == dropped
    # And the session goes on as if the refused turn had never been typed.
    fresh = Conversation(decoder(tiny_target), system=SYSTEM)
    fresh.messages = list(before)
    assert answer(chat, TURNS[3]) == answer(fresh, TURNS[3])


def test_run_refuses_a_prompt_longer_than_the_context_before_any_work(tiny_target):
    args = ["run", "--target", tiny_target, "--ctx", CTX, "-n", 8, "--threads", 1, long_text(2 * CTX)]
    result = CliRunner().invoke(app, [str(a) for a in args])
    assert result.exit_code == 1
    assert result.stdout == ""  # nothing generated, no figures
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the prompt is ") and "context window is 256" in lines[0]
    assert "--ctx" in lines[0]


def test_chat_reports_a_too_long_turn_and_goes_on(tiny_target, tiny_draft):
    result = chat_cli(tiny_target, tiny_draft, f"{TURNS[0]}\n{long_text(2 * CTX)}\n{TURNS[1]}\n")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("error: the prompt is") == 1
    fresh = Conversation(decoder(tiny_target), system=None)
    assert result.stdout == answer(fresh, TURNS[0]) + "\n" + answer(fresh, TURNS[1]) + "\n"


def test_prefill_bar_shows_only_for_long_prompts_on_a_terminal():
    screen = io.StringIO()
    bar = PrefillBar(Console(file=screen, force_terminal=True, width=100), min_tokens=512)
    with bar:
        bar(256, 512)  # short: nothing
        assert screen.getvalue() == ""
        for done in (512, 1024, 1500):
            bar(done, 1500)
    assert "reading the prompt" in screen.getvalue() and "1024/1500" in screen.getvalue()
    piped = io.StringIO()
    with PrefillBar(Console(file=piped, force_terminal=False)) as quiet:
        quiet(512, 4096)
    assert piped.getvalue() == ""


@pytest.mark.real
def test_an_8k_token_prompt_runs_on_the_real_pair_with_a_prefill_bar(qwen_pair, monkeypatch):
    target, draft = qwen_pair
    # Code-like lines so the prompt is realistic; about 8k tokens with Qwen's tokenizer.
    lines = [f"def handler_{i}(request):\n    return respond(request, status={200 + i % 5}, item={i})\n" for i in range(340)]
    prompt = "".join(lines) + "\nWhich status does handler_77 return? Answer with the number only."
    screen = io.StringIO()
    monkeypatch.setattr(run_module, "err", Console(file=screen, force_terminal=True, width=120))
    # Lookup drafting: the draft model would read the 8k prompt too, doubling a prefill of several minutes here.
    args = ["run", "--target", target, "--draft", draft, "--ctx", 10240, "-n", 8, "--method", "lookup", "--json", prompt]
    start = time.perf_counter()
    result = CliRunner().invoke(app, [str(a) for a in args])
    wall = time.perf_counter() - start
    assert result.exit_code == 0, result.output
    stats = json.loads(result.stdout)["stats"]
    assert 7500 <= stats["prompt_tokens"] <= 9500 and stats["prefill_tokens"] == stats["prompt_tokens"]
    assert "reading the prompt" in screen.getvalue()
    print(
        f"\n8k prefill: {stats['prompt_tokens']} tokens in {stats['time_s']['prefill']:.1f} s "
        f"({stats['prefill_tok_per_s']:.0f} tok/s); whole run {wall:.1f} s"
    )
