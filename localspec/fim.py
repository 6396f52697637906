"""Fill in the middle (FIM): the prompt a code model completes at a cursor, and the rules that end an
editor's completion early. No HTTP here: ``serve`` (/infill, /v1/completions with a suffix) uses it, and so
can ``bench``.

The prompt is the one llama-server builds for /infill (``format_prompt_infill`` in the pinned llama.cpp's
tools/server/server-common.cpp), token for token, so an editor plugin gets the completion it would get from
llama-server. With the model's repo-level tokens (FIM_REP, FIM_SEP) it reads::

    FIM_REP "myproject\\n" (FIM_SEP "<filename>\\n" <chunk text>)... FIM_SEP "filename\\n"
    [BOS] FIM_PRE <prefix> <middle> FIM_SUF <suffix> FIM_MID

Without FIM_SEP the chunks are joined by a "--- snippet ---" line instead; without FIM_REP there is no
repo line. Each piece is tokenized on its own, without special tokens except in the middle (llama-server's
``prompt``, which may hold them); the BOS, where the model wants one, comes after the chunks, as upstream
puts it. llama-server's ``--spm-infill`` order (suffix first) is not offered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Protocol

from localspec.errors import UsageError

# llama-server's -b under the plugins' recommended presets (--fim-qwen-*-default): the prompt's prefix and
# suffix share one batch of this many tokens.
DEFAULT_FIM_BATCH = 1024
# Upstream's fixed texts: the project name and the current file's name are placeholders there too.
REPO_NAME = "myproject\n"
CURRENT_FILE = "filename\n"
DEFAULT_CHUNK_FILENAME = "tmp"
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
# The FIM tokens a prompt cannot do without: (name, the GGUF key that gives its id).
REQUIRED = {
    "pre": ("prefix", "tokenizer.ggml.fim_pre_token_id"),
    "suf": ("suffix", "tokenizer.ggml.fim_suf_token_id"),
    "mid": ("middle", "tokenizer.ggml.fim_mid_token_id"),
}


class FimModel(Protocol):
    """What the prompt is built from: the llama.cpp ``Model``'s tokenizer side."""

    path: Path
    bos_id: int
    add_bos: bool

    def tokenize(self, text: str, *, add_bos: bool, special: bool = True) -> list[int]: ...

    def fim_tokens(self) -> dict[str, int | None]: ...


@dataclass(frozen=True)
class Chunk:
    """Text from another file the editor has open (llama-server's ``input_extra``)."""

    text: str
    filename: str = DEFAULT_CHUNK_FILENAME


@dataclass(frozen=True)
class FimRequest:
    """What is around the cursor."""

    prefix: str  # the file before the cursor line
    suffix: str  # the file after the cursor
    middle: str = ""  # the cursor line up to the cursor (llama-server's ``prompt``)
    chunks: tuple[Chunk, ...] = ()


def fim_prompt(model: FimModel, request: FimRequest, *, n_ctx: int, n_batch: int = DEFAULT_FIM_BATCH,
               n_predict: int = -1) -> list[int]:
    """The prompt tokens of ``request``, as llama-server builds them.

    Args:
        n_ctx: the context window; the chunks get what a batch and twice ``n_predict`` leave of it.
        n_batch: the batch the prefix and suffix share (llama-server's -b).
        n_predict: the server's own answer limit (llama-server's -n, -1: none), not the request's.
    """
    fim = fim_tokens(model)

    def text(piece: str) -> list[int]:
        return model.tokenize(piece, add_bos=False, special=False)

    extra = [fim["rep"], *text(REPO_NAME)] if fim["rep"] is not None else []
    for chunk in request.chunks:
        extra += [fim["sep"], *text(chunk.filename + "\n")] if fim["sep"] is not None else text(SNIPPET_SEPARATOR)
        extra += text(chunk.text)
    if fim["sep"] is not None:
        extra += [fim["sep"], *text(CURRENT_FILE)]
    middle = model.tokenize(request.middle, add_bos=False, special=True)
    # Prefix and suffix share a batch 3:1, keeping the tokens nearest the cursor; the suffix's quarter also
    # holds the middle and two FIM tokens. The chunks keep their latest tokens.
    prefix = text(request.prefix)
    prefix = prefix[len(prefix) - min(len(prefix), 3 * (n_batch // 4)):]
    suffix = text(request.suffix)[:max(0, n_batch // 4 - 2 - len(middle))]
    extra = extra[len(extra) - min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra)):]
    bos = [model.bos_id] if model.add_bos else []
    return [*extra, *bos, fim["pre"], *prefix, *middle, fim["suf"], *suffix, fim["mid"]]


def fim_tokens(model: FimModel) -> dict[str, int | None]:
    """The model's FIM token ids; refuses a model without the prefix, suffix and middle ones, naming them."""
    found = model.fim_tokens()
    missing = [(name, key) for role, (name, key) in REQUIRED.items() if found[role] is None]
    if missing:
        names = ", ".join(name for name, _ in missing)
        keys = ", ".join(key for _, key in missing)
        raise UsageError(f"{model.path.name} cannot fill in the middle: its vocabulary has no FIM {names} token "
                         f"({keys}, nor one llama.cpp knows by its text); serve a code model trained for it, "
                         "such as Qwen2.5-Coder")
    return found


class CompletionLimits:
    """llama-server's rules that end an editor's completion before its token budget, fed the answer's text
    piece by piece (each piece as it would be sent).

    ``t_max_predict_ms``: once this long has passed since the first piece, the next piece holding a newline
    ends the answer (a whole line is worth waiting for, a half one is not). ``n_indent``: a line after the
    first that starts with less indentation than this ends the answer, cut before its first character.
    llama-server looks at that line one piece late and finds one newline per piece; so does this.
    """

    def __init__(self, *, n_indent: int = 0, t_max_predict_ms: int = 0,
                 clock: Callable[[], float] = perf_counter) -> None:
        self.n_indent = n_indent
        self.t_max_predict_ms = t_max_predict_ms
        self.clock = clock
        self.text = ""  # the answer so far, after any cut
        self.ended = False
        self._started: float | None = None
        self._has_new_line = False
        self._line_start = 0  # where the line being checked starts (0: none yet)

    def feed(self, piece: str) -> bool:
        """Add the next piece; True when the answer ends with it (``text`` then holds what is kept)."""
        now = self.clock()
        if self._started is None:
            self._started = now
        self.text += piece
        if self._has_new_line and self.n_indent > 0:
            self._check_indent()
        if "\n" in piece:
            self._has_new_line = True
            if 0 < self.t_max_predict_ms < (now - self._started) * 1000:
                self.ended = True
        return self.ended

    def _check_indent(self) -> None:
        if self._line_start > 0:
            line = self.text[self._line_start:]
            indent = len(line) - len(line.lstrip(" \t"))
            if indent < len(line) and indent < self.n_indent:
                self.text = self.text[:self._line_start + indent]
                self.ended = True
        newline = self.text.find("\n", self._line_start)
        if newline >= 0:
            self._line_start = newline + 1
