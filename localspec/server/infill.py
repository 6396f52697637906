"""llama-server's /infill, which editor plugins (llama.vim, llama.vscode) call on every pause in typing.

The body (``input_prefix``, ``input_suffix``, ``input_extra`` chunks, ``prompt``: the cursor line so far)
becomes the one internal ``GenerationRequest`` with a ``FimRequest``; the worker builds llama-server's FIM
prompt from it (localspec/fim.py) and applies the editor's ``n_indent`` and ``t_max_predict_ms``. The answer
is llama-server's JSON (``content``, ``tokens_cached``, ``truncated``, ``timings``...), trimmed to the
``response_fields`` a plugin asks for, whose nested names ("timings/prompt_n") become top-level keys.

Sampling follows llama-server's ``samplers`` chain where localspec's sampling is that same chain (top-k,
top-p, min-p, then ``infill`` as the plugins send it, then temperature); what it is not (penalties, DRY, a
temperature before ``infill``...) is refused, never replaced by another distribution. Fields that only steer
llama-server's slots and cache (``id_slot``, ``cache_prompt``, ``t_max_prompt_ms``, which llama-server does
not implement either) are read and ignored. ``n_cmpl`` completions are answered one after the other, each drafted from the ones before it where they
agree (the answer history), so a sure completion costs one verification pass per copy.
"""

from __future__ import annotations

from localspec.engine.decoding.stats import StopReason
from localspec.fim import Chunk, FimRequest
from localspec.server.request import (
    APIError, GenerationRequest, boolean, integer, invalid, list_field, number, object_body, stop_strings,
)
from localspec.server.results import collect, timings

# llama-server's sampler names (it also takes kebab-case and names without "_") and letters.
SAMPLERS = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "infill", "penalties",
            "adaptive_p")
_ALIASES = {"nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}
_LETTERS = dict(zip("dkpsymtxiea", SAMPLERS))
# n_cmpl's limit: llama-server's default number of slots.
MAX_COMPLETIONS = 4
# localspec's sampling: these filters on the untempered distribution, then the temperature (sampling.py;
# the infill rule, where asked for, goes between them).
CHAIN = ("top_k", "top_p", "min_p", "temperature")
# Fields that change the answer and what leaves it unchanged: anything else is refused.
_NEUTRAL = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "typical_p": 1.0,
            "mirostat": 0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "top_n_sigma": -1.0, "n_probs": 0,
            "ignore_eos": False, "grammar": "", "json_schema": None, "logit_bias": [], "lora": []}


# -- requests ----------------------------------------------------------------------------------------
def parse_infill_request(body: object) -> GenerationRequest:
    body = object_body(body)
    for name, neutral in _NEUTRAL.items():
        if body.get(name) not in (None, neutral):
            raise invalid(f"'{name}' is not supported: leave it out or send {neutral!r}", "unsupported_parameter")
    for name in ("id_slot", "t_max_prompt_ms"):  # one slot; llama-server ignores t_max_prompt_ms too
        integer(body, name, minimum=-1)
    boolean(body, "cache_prompt")  # checked only: the prompt cache is always used (see prompt_cache.py)
    return GenerationRequest(
        fim=FimRequest(prefix=_text(body, "input_prefix", required=True),
                       suffix=_text(body, "input_suffix", required=True),
                       middle=_text(body, "prompt"), chunks=_chunks(body)),
        api="infill",
        max_tokens=_max_tokens(body),
        n_indent=integer(body, "n_indent", minimum=0) or 0,
        t_max_predict_ms=max(0, integer(body, "t_max_predict_ms", minimum=-1) or 0),
        stop=_stop(body.get("stop")),
        stream=boolean(body, "stream") or False,
        seed=integer(body, "seed", minimum=0),
        **_sampling(body),
    )


def completions(body: dict, *, stream: bool) -> int:
    """``n_cmpl`` (alias ``n``): how many completions of the one prompt to answer, as a JSON list when more
    than one. llama-server's limit is its slot count (4 by default); llama.vscode's hint matches its wording."""
    n = integer(body, "n_cmpl", minimum=1)
    n = n if n is not None else integer(body, "n", minimum=1)
    if n is None:
        return 1
    if n > MAX_COMPLETIONS:
        raise invalid(f"Field 'n_cmpl': Value must be between 1 <= value <= {MAX_COMPLETIONS}, but got {n}")
    if n > 1 and stream:
        raise invalid("'n_cmpl' > 1 is answered only with \"stream\": false (as llama.vscode sends it)",
                      "unsupported_parameter")
    return n


def response_fields(body: dict) -> tuple[str, ...]:
    fields = list_field(body, "response_fields")
    if not all(isinstance(f, str) for f in fields):
        raise invalid("'response_fields' must be a list of field names such as \"content\" or \"timings/prompt_n\"")
    return tuple(fields)


def _text(body: dict, name: str, *, required: bool = False) -> str:
    value = body.get(name)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise invalid(f"'{name}' must be a string" + (" (it is required)" if required else "")
                      + "; token ids are not accepted")
    return value


def _chunks(body: dict) -> tuple[Chunk, ...]:
    chunks = []
    for i, chunk in enumerate(list_field(body, "input_extra")):
        if not isinstance(chunk, dict) or not isinstance(chunk.get("text"), str):
            raise invalid(f"input_extra[{i}] must be an object with a \"text\" string (and a \"filename\" string)")
        filename = chunk.get("filename")
        if filename is not None and not isinstance(filename, str):
            raise invalid(f"input_extra[{i}].filename must be a string")
        chunks.append(Chunk(chunk["text"], filename) if filename is not None else Chunk(chunk["text"]))
    return tuple(chunks)


def _max_tokens(body: dict) -> int | None:
    """llama-server's ``n_predict`` (or its aliases): -1 for the server's limit; 0 evaluates the prompt and
    answers the one token its last pass gives anyway, as llama-server does."""
    for name in ("n_predict", "max_tokens", "max_completion_tokens"):
        n = integer(body, name, minimum=-1)
        if n is not None:
            return None if n < 0 else max(n, 1)
    return None


def _stop(stop: object) -> tuple[str, ...]:
    if isinstance(stop, list):
        stop = [s for s in stop if s != ""]  # llama-server skips empty stop strings
    return stop_strings(stop)


def _sampling(body: dict) -> dict:
    """The sampling fields of the request: its own values, for the steps its ``samplers`` chain has."""
    values = {"temperature": number(body, "temperature", 0.0, 2.0), "top_k": integer(body, "top_k", minimum=0),
              "top_p": number(body, "top_p", 0.0, 1.0), "min_p": number(body, "min_p", 0.0, 1.0)}
    chain = _chain(body.get("samplers"))
    if chain is None:
        return values  # llama-server's default chain, which is localspec's
    others = [step for step in chain if step not in (*CHAIN, "infill")]
    if others:
        raise invalid(f"the sampler(s) {', '.join(others)} are not supported; use {', '.join(CHAIN)}",
                      "unsupported_parameter")
    temperature = values["temperature"]
    infill = "infill" in chain
    if "temperature" in chain and temperature is not None and temperature <= 0:
        first = chain.index("temperature")
        if all(i > first for i, step in enumerate(chain) if step == "infill"):
            # Greedy: the filters keep the most likely token, a zero temperature keeps only it, and the infill
            # sampler leaves a single token alone.
            return {"temperature": 0.0}
    filters = [step for step in chain if step != "infill"]
    if filters != sorted(filters, key=CHAIN.index) or len(set(chain)) < len(chain):
        raise invalid(f"'samplers' must keep this order, each once: {', '.join(CHAIN)} (localspec's sampling "
                      "applies them so), with 'infill' after the filters", "unsupported_parameter")
    if infill and any(step in ("top_k", "top_p", "min_p") for step in chain[chain.index("infill"):]):
        raise invalid("'infill' must come after top_k, top_p and min_p in 'samplers' (localspec's sampling applies "
                      "it there, as llama.vim and llama.vscode ask)", "unsupported_parameter")
    if infill and "temperature" in chain[:chain.index("infill")]:
        raise invalid("a temperature before 'infill' in 'samplers' is supported only at 0 (greedy): move "
                      "'temperature' after 'infill' or leave it out", "unsupported_parameter")
    # A step left out of the chain is off; without a temperature step the draw is at temperature 1.
    off = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}
    return {**{step: values[step] if step in chain else off[step] for step in CHAIN}, "infill_sampler": infill}


def _chain(samplers: object) -> list[str] | None:
    """The steps of llama-server's ``samplers`` (names or letters) by their canonical names, without the ones
    it does not know (it skips them too); None when the request has none."""
    if samplers is None:
        return None
    if isinstance(samplers, str):
        return [_LETTERS[c] for c in samplers if c in _LETTERS]
    if not isinstance(samplers, list) or not all(isinstance(s, str) for s in samplers):
        raise invalid("'samplers' must be a list of sampler names (such as [\"top_k\", \"temperature\"]) "
                      "or a string of their letters")
    return [step for name in samplers if (step := _sampler(name)) is not None]


def _sampler(name: str) -> str | None:
    key = name.lower()
    if key in _ALIASES:
        return _ALIASES[key]
    return next((s for s in SAMPLERS if key in (s, s.replace("_", "-"), s.replace("_", ""))), None)


# -- answers -----------------------------------------------------------------------------------------
def _stop_type(done) -> str:
    if done.kept is not None:
        return "limit"
    return {StopReason.EOS: "eos", StopReason.STOP_STRING: "word", StopReason.LENGTH: "limit",
            StopReason.CONTEXT_FULL: "limit"}.get(done.stats.stop_reason, "none")


def pick(body: dict, fields: tuple[str, ...]) -> dict:
    """llama-server's ``response_fields``: just the fields named, a nested one by its path ("timings/prompt_n")
    as a top-level key; a path that names nothing is left out; no fields: the whole body."""
    if not fields:
        return body
    picked = {}
    for path in fields:
        value = body
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            picked[path] = value
    return picked


class InfillFormat:
    """Bodies of /infill: llama-server's completion object, streamed as bare ``data:`` events with no end
    marker (its last event carries the figures and no text)."""

    done_marker = False

    def __init__(self, model: str, fields: tuple[str, ...] = ()) -> None:
        self.model = model
        self.fields = fields

    def _final(self, content: str, done) -> dict:
        stats = done.stats
        return pick({
            "index": 0, "content": content, "tokens": [], "id_slot": 0, "stop": True, "model": self.model,
            "tokens_predicted": stats.generated_tokens, "tokens_evaluated": stats.prompt_tokens,
            # llama-server's meaning: the context ran out (a token budget reached is stop_type "limit").
            "truncated": stats.stop_reason == StopReason.CONTEXT_FULL,
            "stop_type": _stop_type(done), "stopping_word": done.stop or "",
            # What the KV cache holds after the answer: the prompt and every answer token but the last.
            "tokens_cached": max(0, stats.prompt_tokens + stats.generated_tokens - 1),
            "timings": timings(stats, done.method),
        }, self.fields)

    def response(self, events: list, done) -> dict:
        _, text, _ = collect(events)
        return self._final(text if done.kept is None else text[:done.kept], done)

    def stream_start(self) -> list:
        return []

    def stream_event(self, event) -> list:
        return [(None, {"index": 0, "content": event.text, "tokens": [], "stop": False, "id_slot": 0})]

    def stream_keepalive(self) -> list:
        return []

    def stream_end(self, done) -> list:
        return [(None, self._final("", done))]

    def stream_error(self, error: APIError) -> tuple:
        return None, error.body()
