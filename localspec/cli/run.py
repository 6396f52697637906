"""``localspec run PROMPT``: one generation, streamed to stdout, with its figures on stderr (or ``--json``)."""

from __future__ import annotations

import json
import sys
from contextlib import closing
from typing import Annotated, Optional

import typer

from localspec.cli import options as o
from localspec.cli.console import err, out
from localspec.cli.interrupt import CtrlC
from localspec.conversation import Conversation
from localspec.engine.decoding.stats import StopReason
from localspec.errors import ContextFullError, UsageError
from localspec.tui import LiveView, PrefillBar


@o.generation_options()
def run_command(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; read from stdin when absent or '-'.")] = None,
    max_tokens: o.MaxTokensOpt = 256,
    chat: Annotated[bool, typer.Option("--chat/--raw", help="Apply the model's chat template, or continue raw text.")] = True,
    system: Annotated[Optional[str], typer.Option("--system", help="System prompt (chat mode).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option("--stop", help="Stop at this string (repeatable).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print one JSON object with the text and stats.")] = False,
    *,
    generation: o.GenerationOptions,
) -> None:
    """Generate an answer with speculative decoding; the output is the target's own, token for token."""
    text = _read_prompt(prompt)
    pair, decoder, sampling = generation.open()
    conversation = Conversation(decoder, system=system, chat=chat)
    pieces = []
    live = not json_output and sys.stdout.isatty()
    view = LiveView(out, decoder) if live else None
    with PrefillBar(err) as bar, CtrlC() as ctrl_c, closing(
        conversation.ask(
            text,
            max_tokens=max_tokens,
            sampling=sampling,
            stop=stop or (),
            # The live view shows prefill progress in its own status line; a second live display would clash.
            prefill_progress=view.prefill_progress if view is not None else bar,
        )
    ) as answer:
        stream = ctrl_c.until_pressed(answer)
        if view is not None:
            pieces.append(view.stream(stream))  # ends with a newline of its own
        else:
            for piece in stream:
                pieces.append(piece.text)
                if not json_output:
                    sys.stdout.write(piece.text)
                    sys.stdout.flush()
    stats = decoder.stats
    if json_output:
        result = {
            "text": "".join(pieces),
            "model": pair.label,
            "method": decoder.controller.method,
            "sampling": {name: value for name, value in vars(sampling).items() if name != "infill"},  # /infill's
            "stats": stats.to_dict(),
        }
        print(json.dumps(result))
    else:
        sys.stdout.write("" if live else "\n")
        err.print(stats.summary_line() + (" | interrupted" if ctrl_c.pressed else ""), highlight=False)
    if ctrl_c.pressed:
        raise typer.Exit(130)
    if stats.stop_reason == StopReason.CONTEXT_FULL:
        raise ContextFullError(f"the context window ({decoder.target.n_ctx} tokens) filled up; use a larger --ctx")


def _read_prompt(prompt: str | None) -> str:
    if prompt is None or prompt == "-":
        if sys.stdin.isatty():
            raise UsageError("no prompt: pass it as an argument or pipe it on stdin")
        prompt = sys.stdin.read()
    if not prompt.strip():
        raise UsageError("the prompt is empty: pass some text as an argument or on stdin")
    return prompt
