"""Benchmark workloads: prompts grouped into slices, shipped as JSONL or read from a user's file.

One JSON object per line::

    {"workload": "code-edit", "id": "inventory", "prompt": "Add ... ```python ...```"}
    {"workload": "multi-turn", "id": "cart", "turns": ["Here is my code ...", "Now show it again with ..."]}

    {"workload": "completion", "id": "loop", "fim": {"prefix": "...", "suffix": "...", "middle": "    for ",
                                                      "chunks": [{"filename": "a.py", "text": "..."}]}}

``workload`` names the slice; ``id`` is optional (defaults to ``<workload>-<line>``); exactly one of
``prompt`` (a string), ``turns`` (a list of user messages, for multi-turn sessions) or ``fim`` (an editor's
code completion at a cursor: the text before and after it, the cursor line so far, other files' chunks, as
llama.vim sends them to /infill) is required; ``system`` (a system prompt) is optional, not with ``fim``.
Blank lines are skipped. Every error names the file and line.

The shipped ``completion`` slice is cursor positions in localspec's own source, with llama.vim's layout
scaled to a CPU's prefill (40 lines before the cursor, 12 after, two 24-line chunks of other files).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import UsageError
from localspec.fim import Chunk, FimModel, FimRequest, fim_tokens

SHIPPED_DIR = Path(__file__).resolve().parent / "workloads"
# The order slices are shown in; the shipped files define what exists.
SHIPPED_ORDER = ("code-edit", "code-rewrite", "code-new", "completion", "chat", "json", "summarize", "multi-turn",
                 "agent-repeat")
# Slices run only when named in --workloads: agent-repeat is a sequence of 20 requests that share structure,
# for suffix decoding's answer history (--methods none,auto,auto+history), too long for every bench.
NAMED_ONLY = ("agent-repeat",)
_KEYS = {"workload", "id", "prompt", "turns", "system", "fim"}
_FIM_KEYS = {"prefix", "suffix", "middle", "chunks"}


@dataclass(frozen=True)
class BenchPrompt:
    """One prompt of a slice: the user turns (a single one unless multi-turn) and an optional system prompt,
    or (no turns) an editor's fill-in-the-middle request."""

    workload: str
    id: str
    turns: tuple[str, ...]
    system: str | None = None
    fim: FimRequest | None = None


def load_prompt_file(path: Path) -> list[BenchPrompt]:
    """Read one JSONL prompt file; an unreadable or empty file or a malformed line is a UsageError."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read prompt file ({exc})") from exc
    prompts = [_parse_line(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]
    if not prompts:
        raise UsageError(
            f"{path}: no prompts in the file; write one JSON object per line (see 'localspec bench --help')"
        )
    _check_unique_ids(path, prompts)
    return prompts


def shipped_prompts() -> list[BenchPrompt]:
    files = sorted(SHIPPED_DIR.glob("*.jsonl"), key=lambda p: _order(p.stem))
    return [prompt for path in files for prompt in load_prompt_file(path)]


def select(
    prompts: Iterable[BenchPrompt], workloads: list[str] | None, *, per_workload: int | None = None
) -> list[BenchPrompt]:
    """Keep the named slices (when None, all but NAMED_ONLY), in the order named, at most ``per_workload``
    prompts each."""
    prompts = list(prompts)
    available = list(dict.fromkeys(p.workload for p in prompts))
    wanted = workloads or [name for name in available if name not in NAMED_ONLY]
    for name in wanted:
        if name not in available:
            raise UsageError(f"unknown workload {name!r}; choose from {', '.join(available)}")
    chosen = []
    for name in wanted:
        chosen += [p for p in prompts if p.workload == name][:per_workload]
    return chosen


def for_target(prompts: list[BenchPrompt], target: FimModel, *, named: bool) -> tuple[list[BenchPrompt], str | None]:
    """The prompts ``target`` can answer, and a note on what was left out: code completions need its FIM tokens.
    Prompts the user chose (``named``: by slice or file) are refused instead, with the reason."""
    if all(p.fim is None for p in prompts):
        return prompts, None
    try:
        fim_tokens(target)
    except UsageError as exc:
        if named:
            raise
        return [p for p in prompts if p.fim is None], f"left out the completion slice: {exc}"
    return prompts, None


def _parse_line(path: Path, number: int, line: str) -> BenchPrompt:
    where = f"{path}, line {number}"
    try:
        data = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(data, dict):
        raise UsageError(f'{where}: expected a JSON object like {{"workload": ..., "prompt": ...}}')
    unknown = sorted(data.keys() - _KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key {unknown[0]!r}; allowed: {', '.join(sorted(_KEYS))}")
    workload = _text(data, "workload", where, required=True)
    system = _text(data, "system", where)
    if sum(key in data for key in ("prompt", "turns", "fim")) != 1:
        raise UsageError(f"{where}: give exactly one of 'prompt' (a string), 'turns' (a list of strings) or 'fim' "
                         "(an object with 'prefix' and 'suffix')")
    if "fim" in data:
        if system is not None:
            raise UsageError(f"{where}: a 'fim' prompt takes no 'system' (it is a code completion, not a chat)")
        return BenchPrompt(workload, _text(data, "id", where) or f"{workload}-{number}", (), None,
                           _fim(data["fim"], where))
    if "prompt" in data:
        turns = (_text(data, "prompt", where, required=True),)
    else:
        turns = data["turns"]
        if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise UsageError(f"{where}: 'turns' must be a non-empty list of non-empty strings")
        turns = tuple(turns)
    return BenchPrompt(workload, _text(data, "id", where) or f"{workload}-{number}", turns, system)


def _fim(data: object, where: str) -> FimRequest:
    if not isinstance(data, dict) or not isinstance(data.get("prefix"), str) or not isinstance(data.get("suffix"), str):
        raise UsageError(f"{where}: 'fim' must be an object with 'prefix' and 'suffix' strings")
    unknown = sorted(data.keys() - _FIM_KEYS)
    if unknown:
        raise UsageError(f"{where}: unknown key fim.{unknown[0]}; allowed: {', '.join(sorted(_FIM_KEYS))}")
    middle, chunks = data.get("middle", ""), data.get("chunks", [])
    if not isinstance(middle, str):
        raise UsageError(f"{where}: 'fim.middle' must be a string (the cursor line up to the cursor)")
    if not isinstance(chunks, list) or not all(isinstance(c, dict) and isinstance(c.get("text"), str)
                                               and isinstance(c.get("filename", ""), str) for c in chunks):
        raise UsageError(f"{where}: 'fim.chunks' must be a list of objects with a 'text' (and a 'filename') string")
    return FimRequest(data["prefix"], data["suffix"], middle,
                      tuple(Chunk(c["text"], c["filename"]) if "filename" in c else Chunk(c["text"]) for c in chunks))


def _text(data: dict, key: str, where: str, *, required: bool = False) -> str | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value.strip():
        raise UsageError(f"{where}: '{key}' must be a non-empty string")
    return value


def _check_unique_ids(path: Path, prompts: list[BenchPrompt]) -> None:
    # Results are keyed by (workload, id), so a repeated id would silently merge two prompts' figures.
    seen: set[tuple[str, str]] = set()
    for prompt in prompts:
        key = (prompt.workload, prompt.id)
        if key in seen:
            raise UsageError(f"{path}: id {prompt.id!r} appears twice in workload {prompt.workload!r}")
        seen.add(key)


def _order(name: str) -> tuple[int, str]:
    return (SHIPPED_ORDER.index(name) if name in SHIPPED_ORDER else len(SHIPPED_ORDER), name)
