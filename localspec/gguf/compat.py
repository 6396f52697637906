"""Can this draft model be paired with this target? Compares tokenizers and chat templates from GGUF headers.

The target verifies every drafted id, so output stays the target's whatever the draft proposes; but a draft
whose id N means other text than the target's proposes nonsense (near-zero acceptance, or ids the target
does not have). So differing vocabularies are errors; merges, special ids, templates and tokenization
only change how often drafts are accepted, so they are warnings; a chat template that reaches out of the
sandbox is a security finding. Like llama.cpp (and unlike tools that
compare vocabulary sizes only), every id's text is compared.
"""

from __future__ import annotations

import difflib
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ContextManager

from gguf import TokenType

from localspec.errors import GGUFError, TemplateError
from localspec.gguf.heads import companion_pairing, model_heads
from localspec.gguf.memory import architecture, speculation_note
from localspec.gguf.templates import render_chat, template_security_findings

FIRST_DIFFERENCES_SHOWN = 5
# Token types whose text never comes out of normal text: differing there cannot change what users see.
_SPECIAL_TYPES = frozenset({TokenType.UNKNOWN, TokenType.CONTROL, TokenType.USER_DEFINED, TokenType.UNUSED})
# (label, GGUF keys tried in order; llama.cpp renamed the FIM keys once).
SPECIAL_TOKEN_KEYS = (
    ("BOS", ("tokenizer.ggml.bos_token_id",)),
    ("EOS", ("tokenizer.ggml.eos_token_id",)),
    ("EOT", ("tokenizer.ggml.eot_token_id",)),
    ("PAD", ("tokenizer.ggml.padding_token_id",)),
    ("FIM prefix", ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id")),
    ("FIM suffix", ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id")),
    ("FIM middle", ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id")),
    ("add BOS", ("tokenizer.ggml.add_bos_token",)),
    ("add EOS", ("tokenizer.ggml.add_eos_token",)),
)

_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
_SYSTEM = {"role": "system", "content": "You are a careful coding assistant."}
_USER = {"role": "user", "content": "Write a Python function that reverses a string."}
_ANSWER = {"role": "assistant", "content": "def reverse(s):\n    return s[::-1]"}
_FOLLOW_UP = {"role": "user", "content": "Now make it handle None."}
# (name, messages, render options): what a chat, a tool-using agent and a completed transcript send.
SAMPLE_CONVERSATIONS: tuple[tuple[str, list[dict], dict], ...] = (
    ("system + user", [_SYSTEM, _USER], {}),
    ("user only", [_USER], {}),
    ("multi-turn", [_SYSTEM, _USER, _ANSWER, _FOLLOW_UP], {}),
    ("finished transcript, no generation prompt", [_SYSTEM, _USER, _ANSWER], {"add_generation_prompt": False}),
    ("with tools", [_SYSTEM, {"role": "user", "content": "Weather in Paris?"}], {"tools": [_TOOL]}),
    (
        "tool call and result",
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
            },
            {"role": "tool", "content": '{"temperature_c": 18}'},
        ],
        {"tools": [_TOOL]},
    ),
)
SAMPLE_TEXTS = (
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "naïve café, 東京, Привет, emoji 🚀🧪, math ∑x² ≤ ∞",
    "a  b\t\tc\n\n\n    d      e\r\n",
    "    if (x) {\n\t\treturn y;\n\t}",
)


@dataclass(frozen=True)
class Finding:
    code: str
    severity: str  # "ok", "warning", "error" or "security"
    title: str
    detail: str = ""


@dataclass(frozen=True)
class Report:
    findings: list[Finding]
    verdict: str  # "compatible", "compatible with warnings" or "incompatible"
    first_reason: str | None

    @property
    def compatible(self) -> bool:
        return self.verdict != "incompatible"

    def to_dict(self) -> dict:
        return {
            "verdict": self.verdict,
            "first_reason": self.first_reason,
            "findings": [asdict(f) for f in self.findings],
        }


def make_report(findings: list[Finding]) -> Report:
    """The verdict follows the worst severity; the first blocking finding is the reason given."""
    # A security finding outranks any tokenizer difference as the reason given.
    blocking = [f for f in findings if f.severity == "security"] + [f for f in findings if f.severity == "error"]
    if blocking:
        first = blocking[0]
        return Report(findings, "incompatible", f"{first.title}: {first.detail}" if first.detail else first.title)
    if any(f.severity == "warning" for f in findings):
        return Report(findings, "compatible with warnings", None)
    return Report(findings, "compatible", None)


def check_pair(
    target_header: Mapping[str, object],
    draft_header: Mapping[str, object],
    *,
    target_vocab_path: str | Path | None = None,
    draft_vocab_path: str | Path | None = None,
    open_tokenizer: Callable[[str | Path], ContextManager] | None = None,
) -> Report:
    """Compare two GGUF headers (from ``header.read_header``); with both vocab paths and ``open_tokenizer`` (a
    context manager giving an object with ``tokenize(text)``, raising GGUFError), also compare tokenization."""
    t, d = _Side("target", target_header), _Side("draft", draft_header)
    heads = _heads_finding(t, d)
    findings = [
        *([heads] if heads.severity == "error" else []),  # a companion head's refusal is the reason given
        _tokenizer_finding(t, d),
        _vocab_size_finding(t, d),
        _token_text_finding(t, d),
        _token_types_finding(t, d),
        _merges_finding(t, d),
        _special_tokens_finding(t, d),
        *_template_security_findings(t),
        *_template_security_findings(d),
        _template_finding(t, d),
        _memory_finding(t, d),
        *([heads] if heads.severity != "error" else []),
    ]
    findings.append(_round_trip_finding(t, d, target_vocab_path, draft_vocab_path, open_tokenizer, findings))
    return make_report(findings)


def check_model(header: Mapping[str, object]) -> Report:
    """One model alone (no draft to pair): its template's safety, its memory and its drafting heads."""
    side = _Side("model", header)
    heads = model_heads(header)
    findings = [
        *_template_security_findings(side),
        Finding("memory", "ok", "Memory and rollback", speculation_note(architecture(header))),
        # A companion head is no model to run alone.
        Finding("heads", "warning" if heads.companion else "ok",
                "Drafting heads", heads.describe()),
    ]
    return make_report(findings)


class _Side:
    """One model's header, with the tokenizer fields read defensively (a hostile header may mistype them)."""

    def __init__(self, name: str, header: Mapping[str, object]) -> None:
        self.name = name
        self.header = header
        self.model = _typed(header, "tokenizer.ggml.model", str)
        self.pre = _typed(header, "tokenizer.ggml.pre", str)
        self.tokens: list[str] = _typed_list(header, "tokenizer.ggml.tokens", str) or []
        self.types: list[int] = _typed_list(header, "tokenizer.ggml.token_type", int) or []
        self.merges = _typed_list(header, "tokenizer.ggml.merges", str)
        self.scores = _typed_list(header, "tokenizer.ggml.scores", float)
        self.template = _typed(header, "tokenizer.chat_template", str)

    def special(self, keys: Sequence[str]) -> object:
        return next((self.header[k] for k in keys if k in self.header), None)

    def token_text(self, key: str) -> str:
        token_id = _typed(self.header, key, int)
        return self.tokens[token_id] if token_id is not None and 0 <= token_id < len(self.tokens) else ""

    def is_special(self, token_id: int) -> bool:
        return token_id < len(self.types) and self.types[token_id] in _SPECIAL_TYPES


def _typed(header: Mapping[str, object], key: str, kind: type):
    value = header.get(key)
    return value if isinstance(value, kind) and not (kind is int and isinstance(value, bool)) else None


def _typed_list(header: Mapping[str, object], key: str, kind: type) -> list | None:
    value = header.get(key)
    if isinstance(value, list) and all(isinstance(v, kind) for v in value):
        return value
    return None


def _tokenizer_finding(t: _Side, d: _Side) -> Finding:
    both = f"target {t.model} (pre-tokenizer {t.pre}), draft {d.model} (pre-tokenizer {d.pre})"
    if t.model is None or d.model is None:
        return Finding("tokenizer", "error", "A header has no tokenizer.ggml.model", both)
    if t.model != d.model:
        return Finding("tokenizer", "error", "Tokenizer models differ", both)
    if t.pre != d.pre:
        # Same vocabulary type, different splitting rules: prompts split differently, acceptance drops.
        return Finding("tokenizer", "warning", "Pre-tokenizers differ", both)
    return Finding("tokenizer", "ok", "Same tokenizer model and pre-tokenizer", f"{t.model} / {t.pre}")


def _vocab_size_finding(t: _Side, d: _Side) -> Finding:
    nt, nd = len(t.tokens), len(d.tokens)
    sizes = f"target {nt} tokens, draft {nd}"
    if not nt or not nd:
        return Finding("vocab-size", "error", "A header has no token list", sizes)
    if nt == nd:
        return Finding("vocab-size", "ok", "Same vocabulary size", sizes)
    longer = t if nt > nd else d
    if all(longer.is_special(i) for i in range(min(nt, nd), max(nt, nd))):
        return Finding("vocab-size", "warning", "Vocabulary sizes differ only in special/unused ids", sizes)
    return Finding("vocab-size", "error", "Vocabulary sizes differ", sizes)


def _token_text_finding(t: _Side, d: _Side) -> Finding:
    differing = [i for i, (a, b) in enumerate(zip(t.tokens, d.tokens)) if a != b]
    common = min(len(t.tokens), len(d.tokens))
    if not differing:
        return Finding("token-text", "ok", "Same text for every id", f"{common} ids compared")
    examples = ", ".join(f"{i}: {_show(t.tokens[i])} vs {_show(d.tokens[i])}" for i in differing[:FIRST_DIFFERENCES_SHOWN])
    detail = f"{len(differing)} of {common} ids differ, e.g. {examples}"
    if all(t.is_special(i) and d.is_special(i) for i in differing):
        return Finding("token-text", "warning", "Token texts differ only for special/control/unused ids", detail)
    return Finding("token-text", "error", "Token texts differ", detail)


def _token_types_finding(t: _Side, d: _Side) -> Finding:
    if t.types == d.types:
        return Finding("token-types", "ok", "Same token types", f"sha256 {_digest(t.types)}")
    first = next((i for i, (a, b) in enumerate(zip(t.types, d.types)) if a != b), min(len(t.types), len(d.types)))
    detail = f"sha256 {_digest(t.types)} vs {_digest(d.types)}; first difference at id {first}: {_type_name(t, first)} vs {_type_name(d, first)}"
    return Finding("token-types", "warning", "Token types differ", detail)


def _merges_finding(t: _Side, d: _Side) -> Finding:
    # BPE vocabularies tokenize by merges, SentencePiece ones by scores: compare whichever the pair has.
    what, a, b = ("BPE merges", t.merges, d.merges) if t.merges or d.merges else ("token scores", t.scores, d.scores)
    if a == b:
        return Finding("merges", "ok", f"Same {what}", f"{len(a or [])} entries, sha256 {_digest(a or [])}")
    a, b = a or [], b or []
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    detail = (
        f"target {len(a)} entries (sha256 {_digest(a)}), draft {len(b)} (sha256 {_digest(b)}); "
        f"first difference at #{first}: {_entry(a, first)} vs {_entry(b, first)}"
    )
    return Finding("merges", "warning", f"{what[0].upper()}{what[1:]} differ", detail)


def _special_tokens_finding(t: _Side, d: _Side) -> Finding:
    pairs = [(label, t.special(keys), d.special(keys)) for label, keys in SPECIAL_TOKEN_KEYS]
    differing = [f"{label}: {a} vs {b}" for label, a, b in pairs if a != b]
    if differing:
        return Finding("special-tokens", "warning", "Special token ids or flags differ", "; ".join(differing))
    present = [f"{label} {a}" for label, a, _ in pairs if a is not None]
    return Finding("special-tokens", "ok", "Same special token ids and flags", ", ".join(present))


def _template_security_findings(side: _Side) -> list[Finding]:
    if side.template is None:
        return []
    try:
        problems = template_security_findings(side.template)
    except TemplateError as exc:
        return [Finding("template-parse", "warning", f"The {side.name} chat template does not parse", str(exc))]
    if not problems:
        return []
    return [Finding("template-security", "security", f"The {side.name} chat template reaches outside the sandbox", "; ".join(problems[:3]))]


def _template_finding(t: _Side, d: _Side) -> Finding:
    if t.template is None or d.template is None:
        if t.template == d.template:
            return Finding("chat-template", "ok", "Neither model has a chat template")
        missing = t if t.template is None else d
        return Finding("chat-template", "warning", f"The {missing.name} has no chat template", "the target's template is used for both")
    if t.template == d.template:
        return Finding("chat-template", "ok", "Identical chat templates", f"sha256 {_digest([t.template])}")
    if not _renderable(t) or not _renderable(d):
        return Finding("chat-template", "warning", "Chat templates differ and were not rendered", "see the template findings")
    same, differ, first_diff = [], [], ""
    for name, messages, options in SAMPLE_CONVERSATIONS:
        a, b = _render_sample(t, messages, options), _render_sample(d, messages, options)
        (same if a == b else differ).append(name)
        if a != b and not first_diff:
            first_diff = f"first difference ({name}): {_short_diff(a, b)}"
    if not differ:
        return Finding("chat-template", "ok", "Chat templates differ in source but render identically", f"{len(same)} sample conversations")
    detail = f"identical for: {', '.join(same) or 'none'}; {first_diff}"
    return Finding("chat-template", "warning", f"Chat templates render differently for: {', '.join(differ)}", detail)


def _memory_finding(t: _Side, d: _Side) -> Finding:
    """Informational: how each model's memory rolls back, which sets what speculation costs on it."""
    notes = [f"{side.name} {speculation_note(architecture(side.header))}" for side in (t, d)]
    return Finding("memory", "ok", "Memory and rollback", "; ".join(notes))


def _heads_finding(t: _Side, d: _Side) -> Finding:
    """The heads each model carries; a companion head (EAGLE-3, DFlash) as the draft must fit the target."""
    draft = model_heads(d.header)
    if draft.companion:
        kind = draft.architecture
        problems = companion_pairing(t.header, d.header)
        if problems:
            return Finding("heads", "error", f"The draft is {draft.companion} head that cannot read this target",
                           "; ".join(problems))
        layers = d.header.get(f"{kind}.target_layers")
        return Finding("heads", "ok", f"The draft is {draft.companion} head for this target",
                       f"it reads the inputs of target layers {layers}; --method {kind} (and auto) draft with it")
    notes = [f"{side.name}: {model_heads(side.header).describe()}" for side in (t, d)]
    return Finding("heads", "ok", "Drafting heads", "; ".join(notes))


def _renderable(side: _Side) -> bool:
    try:
        return not template_security_findings(side.template or "")
    except TemplateError:
        return False


def _render_sample(side: _Side, messages: list[dict], options: dict) -> str:
    try:
        return render_chat(
            side.template or "",
            messages,
            bos_token=side.token_text("tokenizer.ggml.bos_token_id"),
            eos_token=side.token_text("tokenizer.ggml.eos_token_id"),
            **options,
        )
    except TemplateError as exc:
        return f"(render failed: {exc})"


def _short_diff(a: str, b: str, max_lines: int = 4) -> str:
    lines = [
        line[:120]
        for line in difflib.unified_diff(a.splitlines(), b.splitlines(), "target", "draft", n=0, lineterm="")
        if line[:1] in "+-" and not line.startswith(("---", "+++"))
    ]
    return " | ".join(lines[:max_lines])


def _digest(values: Sequence[object]) -> str:
    return hashlib.sha256("\x00".join(map(str, values)).encode("utf-8", "surrogateescape")).hexdigest()[:12]


def _show(text: str) -> str:
    # repr escapes newlines and the surrogates that stand for invalid UTF-8, so a table stays one line.
    return repr(text)[:60]


def _entry(rows: Sequence[object], index: int) -> str:
    return _show(str(rows[index])) if index < len(rows) else "(none)"


def _type_name(side: _Side, token_id: int) -> str:
    if token_id >= len(side.types):
        return "(none)"
    try:
        return TokenType(side.types[token_id]).name
    except ValueError:
        return str(side.types[token_id])


def _round_trip_finding(
    t: _Side, d: _Side, target_path: str | Path | None, draft_path: str | Path | None,
    open_tokenizer: Callable[[str | Path], ContextManager] | None, so_far: list[Finding],
) -> Finding:
    if target_path is None or draft_path is None or open_tokenizer is None:
        return Finding("round-trip", "ok", "Round-trip tokenization skipped", "headers only (no local files)")
    if any(f.severity in ("error", "security") for f in so_far):
        return Finding("round-trip", "ok", "Round-trip tokenization skipped", "already incompatible")
    texts = [*SAMPLE_TEXTS, _special_sample(t)]
    try:
        with open_tokenizer(target_path) as a, open_tokenizer(draft_path) as b:
            results = [(text, a.tokenize(text), b.tokenize(text)) for text in texts]
    except GGUFError as exc:
        return Finding("round-trip", "error", "llama.cpp cannot load a vocabulary", str(exc))
    differing = [(text, x, y) for text, x, y in results if x != y]
    if not differing:
        return Finding("round-trip", "ok", "Sample texts tokenize to the same ids", f"{len(texts)} texts, code, unicode, whitespace and special tokens")
    text, x, y = differing[0]
    detail = f"{len(differing)} of {len(texts)} texts differ, e.g. {_show(text)}: {x[:8]} vs {y[:8]}"
    return Finding("round-trip", "warning", "Sample texts tokenize to different ids", detail)


def _special_sample(side: _Side) -> str:
    """A chat-like string made of the target's own special tokens, which must tokenize as single ids."""
    bos, eos, eot = (side.token_text(f"tokenizer.ggml.{k}_token_id") for k in ("bos", "eos", "eot"))
    return f"{bos}user\nhello{eot or eos}\n{eos}"
