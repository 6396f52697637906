"""Stock llama.cpp as the yardstick: the same prompts through stock llama.cpp tools and through localspec.

The stock tools are what ``scripts/build-llama-cpp-stock`` builds from the llama.cpp tree vendored in
the pinned llama-cpp-python, unpatched: ``llama-completion`` (the target alone), ``llama-speculative-simple``
(n-gram and draft-model speculation) and ``llama-lookup`` (prompt lookup).

Every engine gets the same model files, threads, context size, token budget and greedy decoding, and
the same prompt string: the chat-templated text. The stock tools tokenize it with special tokens parsed,
as localspec does, so its chat markers become the same special tokens; this is checked per prompt
against the token ids ``llama-completion --verbose-prompt`` prints. Every engine starts from an empty KV
cache, as a fresh stock process does (so a multi-turn prompt is prefilled whole). Configurations run
interleaved: for each prompt and run, every engine generates once, in an order rotated every round (across
prompts too, so that with one run no engine is always measured first).

How each engine's figures are read:

- ``llama-completion``: decode from ``common_perf_print: eval time = X ms / N runs`` (one-token
  decodes) plus the decode's share of ``sampling time = X ms`` (choosing each token: N of the N + 1
  tokens it samples, the first following the prefill), as localspec's rounds include choosing theirs and
  a user waits for both; prefill from ``prompt eval time = X ms / N tokens``. On a CPU the sampling is a
  fraction of a percent of a pass; beside a 2 ms GPU pass it is several percent.
- ``llama-speculative-simple`` and ``llama-lookup``: decode from ``decoded N tokens in S seconds`` (the
  whole draft-verify loop), prefill from ``encoded N tokens in S seconds``, drafts from ``n_drafted`` and
  ``n_accept``. Both generate one token more than ``-n`` asks, so they are given one fewer. Some drafts
  ignore the budget (ngram-simple always drafts its 48 tokens; llama-lookup accepts a whole draft past
  ``-n``): the tokens decoded past it count in the rate and the acceptance as the tools print them, and
  each row says how many there were (``past_budget``), since a copy's last draft is its likeliest.
- ``llama-server`` (``/infill``), for code completions only: decode from ``timings.predicted_n`` and
  ``predicted_ms``, prefill from ``prompt_n`` and ``prompt_ms``, drafts from ``draft_n`` and
  ``draft_n_accepted``. A completion's prompt is built from pieces tokenized apart (fim.py), which no text
  given to llama-completion reproduces, so the completion slice is measured against stock llama-server
  (started once per configuration with the editor plugins' batch settings, each request with its prompt
  cache off) as the stock target alone, and its speculative modes, instead of the command-line tools; the
  prompt's length is checked against localspec's.
- localspec: its own GenerationStats, from the in-process bench runner.

Agreement is measured, never assumed: stock speculative modes verify drafts with batch kernels that are
not batch-invariant (llama.cpp #23335), so their output can leave stock target-alone output. Each
engine's generated text (an end-of-generation token removed) is compared with llama-completion's of the
same round; a shorter answer that is a prefix of the other agrees if it ended at the token budget.

JSON (``--json FILE``), schema ``localspec-bench-stock/1``: ``model``, ``target``, ``draft``,
``llama_cpp_bin``, ``settings`` (runs, max_tokens, threads, n_ctx, localspec_kernels, engines) and
``rows``, one per workload (and ``all``) and engine::

    {"workload": str, "engine": str, "stock": bool, "prompts": int, "runs": int,
     "decode_tok_per_s": float, "prefill_tok_per_s": float,   # per prompt the median over runs, then the mean
     "decode_ratio": float, "prefill_ratio": float,   # to stock llama-completion in the same round: per prompt
                                                      # the median, then the geometric mean over prompts
     "decode_ratio_range": [float, float] | null,     # one run's decode ratio, lowest and highest over the runs
                                                      # of the prompt where they lie furthest apart
     "drafted": int | null, "accepted": int | null, "acceptance_rate": float | null,  # pooled; null: no drafts
     "per_position_acceptance": [float, ...] | null,  # P(draft position i accepted | reached), pooled; null
                                                      # where the tool does not say (stock's print totals)
     "decoded_tokens": float,                         # tokens the decode rate counts, per answer
     "past_budget": float,                            # of those, decoded past max_tokens (a draft accepted
                                                      # past -n: the rate and acceptance count it)
     "choosing_share": float | null,                  # of the decode time, choosing tokens outside the passes
                                                      # (llama-completion's sampling time; 0 where not apart)
     "identical": bool,                               # every answer agrees with stock llama-completion's
     "differences": [{"prompt": str, "index": int, "baseline": str, "other": str}, ...]}  # first per prompt
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from statistics import fmean, geometric_mean, median
from typing import TypeVar

from localspec.bench.runner import (
    BenchRunner,
    BenchSettings,
    Config,
    PreparedPrompt,
    ProgressCallback,
    in_pass,
    measuring_order,
)
from localspec.bench.workloads import BenchPrompt
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.stats import GenerationStats, StopReason
from localspec.engine.drafters.mtp import MtpDrafter
from localspec.engine.drafters.registry import method_missing
from localspec.engine.llama.model import Model
from localspec.errors import LocalspecError, UsageError

SCHEMA = "localspec-bench-stock/1"
BUILD_HINT = "build them with scripts/build-llama-cpp-stock and pass the directory it prints"
TOOL_TIMEOUT_S = 1800.0
# Stock tools log from a thread whose queue is not flushed at exit (llama.cpp leaks its logger on purpose,
# common/log.cpp, issue 22142), so on a busy machine a run can lose its timing lines: it is run again. With
# both cores busy, 3 of 7 quick reports lost them in all 3 runs of some tool.
TRUNCATED_ATTEMPTS = 8
T = TypeVar("T")


@dataclass(frozen=True)
class Engine:
    """One configuration of the comparison: a stock tool with its options, or a localspec method."""

    label: str
    tool: str | None = None  # the stock binary; None for localspec
    args: tuple[str, ...] = ()
    uses_draft: bool = False  # a draft model given as the pair's draft
    uses_head: bool = False  # runs the target's own MTP head: only where it has one
    uses_companion: str | None = None  # the kind of companion head ("eagle3", "dflash") given as the pair's draft
    config: Config | None = None  # localspec's configuration

    @property
    def stock(self) -> bool:
        return self.tool is not None


# Only display options beyond the stock defaults: the prompt is not echoed and special tokens are
# printed as text (as the speculative tools always do), so the generated text can be compared.
STOCK_BASELINE = Engine("stock llama-completion", "llama-completion", ("-no-cnv", "--no-display-prompt", "-sp"))
STOCK_ENGINES = (
    STOCK_BASELINE,
    Engine("stock ngram-simple", "llama-speculative-simple", ("--spec-type", "ngram-simple")),
    Engine("stock ngram-mod", "llama-speculative-simple", ("--spec-type", "ngram-mod")),
    Engine("stock draft-simple", "llama-speculative-simple", ("--spec-type", "draft-simple"), uses_draft=True),
    Engine("stock llama-lookup", "llama-lookup"),
    Engine("stock draft-mtp", "llama-speculative-simple", ("--spec-type", "draft-mtp"), uses_head=True),
    Engine("stock draft-eagle3", "llama-speculative-simple", ("--spec-type", "draft-eagle3"), uses_companion="eagle3"),
    Engine("stock draft-dflash", "llama-speculative-simple", ("--spec-type", "draft-dflash"), uses_companion="dflash"),
)
# Code completions (see the module docstring): llama-server with the plugins' -ub/-b, one slot, no web UI.
_SERVER_ARGS = ("-ub", "1024", "-b", "1024", "-np", "1", "--no-webui")
STOCK_SERVER = Engine("stock llama-server /infill", "llama-server", _SERVER_ARGS)
STOCK_SERVER_ENGINES = (
    STOCK_SERVER,
    Engine("stock server ngram-mod", "llama-server", (*_SERVER_ARGS, "--spec-type", "ngram-mod")),
    Engine("stock server draft-simple", "llama-server", (*_SERVER_ARGS, "--spec-type", "draft-simple"), uses_draft=True),
)
STOCK_TOOLS = tuple(dict.fromkeys(e.tool for e in (*STOCK_ENGINES, *STOCK_SERVER_ENGINES)))
SERVER_START_TIMEOUT_S = 300.0


def localspec_engine(config: Config) -> Engine:
    return Engine(f"localspec {config.label}", config=config)


@dataclass
class EngineRun:
    """One timed generation of one engine on one prompt."""

    text: str  # the generated text, without an end-of-generation token
    decode_tokens: int
    decode_s: float
    prefill_tokens: int
    prefill_s: float
    drafted: int | None = None  # None where the engine does not draft
    accepted: int | None = None
    stopped: bool = False  # ended with an end-of-generation token, not at the token budget
    choosing_s: float = 0.0  # of decode_s, the time spent choosing tokens apart from the passes (stock's sampler)
    # Drafts that reached position i, and were accepted there (localspec's engines; stock's tools print totals).
    position_drafted: tuple[int, ...] = ()
    position_accepted: tuple[int, ...] = ()

    @property
    def decode_tok_per_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else None

    @property
    def prefill_tok_per_s(self) -> float | None:
        return self.prefill_tokens / self.prefill_s if self.prefill_s > 0 else None


@dataclass(frozen=True)
class TextDifference:
    """Where an engine's text first leaves stock target-alone text (character index, the texts from there)."""

    index: int
    baseline: str
    other: str


@dataclass
class Round:
    """Every engine once on one prompt."""

    prompt: BenchPrompt
    runs: dict[str, EngineRun] = field(default_factory=dict)  # by engine label


@dataclass
class StockResult:
    engines: list[Engine]
    rounds: list[Round]
    max_tokens: int  # the budget every engine was given


class StockOutputError(LocalspecError):
    """A stock tool failed or printed something this module cannot read."""


class TruncatedOutputError(StockOutputError):
    """The output stops before lines the tool always prints last.

    llama.cpp's tools log (stdout included) through a background thread and do not wait for it at exit
    (llama.cpp #22142), so the last lines can be lost, more often on a busy machine: run it again.
    """


# -- reading the stock tools' output -------------------------------------------------------------
# Log lines start with a timestamp and level, e.g. "0.20.161.383 I common_perf_print: prompt eval time = ...".
_PERF_PROMPT = re.compile(r"\bprompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens")
_PERF_EVAL = re.compile(r"\beval time =\s*([\d.]+) ms /\s*(\d+) runs")
_PERF_SAMPLING = re.compile(r"\bsampling time =\s*([\d.]+) ms")
_ENCODED = re.compile(r"\bencoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DECODED = re.compile(r"\bdecoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"\bn_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"\bn_accept\s*=\s*(\d+)")
_PROMPT_SIZE = re.compile(r"number of tokens in prompt = (\d+)")
_PROMPT_TOKEN = re.compile(r"^(?:\S+ I)?\s*(\d+) -> '", re.MULTILINE)
# llama-completion ends its answer with " [end of text]\n" after an end-of-generation token, then "\n\n";
# the speculative tools print "\n\n" before the prompt echo and "\n\n" twice after the answer.
_END_OF_TEXT = b" [end of text]\n"
_COMPLETION_TAIL = b"\n\n"
_SPEC_HEAD = b"\n\n"
_SPEC_TAIL = b"\n\n\n\n"


def _search(pattern: re.Pattern, log: str, tool: str) -> re.Match:
    match = pattern.search(log)
    if match is None:
        raise TruncatedOutputError(f"{tool} printed no line like {pattern.pattern!r}")
    return match


def parse_completion(stdout: bytes, log: str) -> EngineRun:
    """llama-completion -no-cnv --no-display-prompt -sp: stdout is the answer, the timings are in the log."""
    prompt = _search(_PERF_PROMPT, log, "llama-completion")
    decode = _search(_PERF_EVAL, log, "llama-completion")
    sampling = _search(_PERF_SAMPLING, log, "llama-completion")
    runs = int(decode[2])
    choosing_s = float(sampling[1]) * runs / (runs + 1) / 1e3
    answer = stdout.removesuffix(_COMPLETION_TAIL)  # logged before the timings, so present with them
    stopped = answer.endswith(_END_OF_TEXT)
    return EngineRun(
        answer.removesuffix(_END_OF_TEXT).decode("utf-8", "replace"),
        decode_tokens=runs,
        decode_s=float(decode[1]) / 1e3 + choosing_s,
        prefill_tokens=int(prompt[2]),
        prefill_s=float(prompt[1]) / 1e3,
        stopped=stopped,
        choosing_s=choosing_s,
    )


def parse_speculative(stdout: bytes, log: str, prompt_echo: bytes, tool: str) -> EngineRun:
    """llama-speculative-simple or llama-lookup: stdout echoes the prompt, then the answer; timings in the log."""
    encoded = _search(_ENCODED, log, tool)
    decoded = _search(_DECODED, log, tool)
    drafted = _search(_DRAFTED, log, tool)
    accepted = _search(_ACCEPTED, log, tool)
    if not stdout.endswith(_SPEC_TAIL):
        raise TruncatedOutputError(f"{tool}'s output lacks its final blank lines")
    head = _SPEC_HEAD + prompt_echo
    if not stdout.startswith(head):
        raise StockOutputError(
            f"{tool} echoed another prompt than the one sent: it tokenized the prompt differently "
            f"(or is not a build from scripts/build-llama-cpp-stock)"
        )
    # The printed encode speed is not used: llama-lookup divides by its token list after generation.
    return EngineRun(
        stdout[len(head) : -len(_SPEC_TAIL)].decode("utf-8", "replace"),
        decode_tokens=int(decoded[1]),
        decode_s=float(decoded[2]),
        prefill_tokens=int(encoded[1]),
        prefill_s=float(encoded[2]),
        drafted=int(drafted[1]),
        accepted=int(accepted[1]),
    )


def parse_prompt_tokens(log: str) -> list[int]:
    """The prompt's token ids from llama-completion --verbose-prompt (``   id -> 'piece'`` lines)."""
    size = _search(_PROMPT_SIZE, log, "llama-completion")
    tokens = [int(m[1]) for m in _PROMPT_TOKEN.finditer(log, size.end())][: int(size[1])]
    if len(tokens) < int(size[1]):
        raise TruncatedOutputError(f"llama-completion listed {len(tokens)} of the {size[1]} prompt tokens")
    return tokens


def first_difference(baseline: str, other: str, *, context: int = 24) -> TextDifference | None:
    """None when the texts are equal, else the first differing character and up to ``context`` chars from it."""
    if baseline == other:
        return None
    i = len(os.path.commonprefix([baseline, other]))
    return TextDifference(i, baseline[i : i + context], other[i : i + context])


def compare_runs(baseline: EngineRun, other: EngineRun) -> TextDifference | None:
    """Where ``other``'s answer leaves ``baseline``'s; None if they agree on every token both generated.

    Answers can differ in length without disagreeing: llama-lookup accepts a whole draft past ``-n``. A
    shorter answer that is a prefix of the other counts as agreement only if it ended at the budget, not
    at an end-of-generation token the other engine did not produce.
    """
    difference = first_difference(baseline.text, other.text)
    if difference is None:
        return None
    shorter = min(baseline, other, key=lambda run: len(run.text))
    if difference.index == len(shorter.text) and not shorter.stopped:
        return None
    return difference


def find_tools(bin_dir: Path) -> dict[str, Path]:
    """The stock binaries in ``bin_dir``; a missing directory or tool is a UsageError naming the fix."""
    if not bin_dir.is_dir():
        raise UsageError(f"--vs-llama-cpp {bin_dir}: no such directory; {BUILD_HINT}")
    tools = {name: bin_dir / name for name in STOCK_TOOLS}
    missing = [name for name, path in tools.items() if not (path.is_file() and os.access(path, os.X_OK))]
    if missing:
        raise UsageError(f"--vs-llama-cpp {bin_dir}: no executable {', '.join(missing)} there; {BUILD_HINT}")
    return tools


# -- running -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StockSettings:
    configs: Sequence[Config]  # localspec's configurations
    runs: int
    max_tokens: int
    # With the target over RPC: the servers the stock tools use, on the same machines as localspec's (each
    # rpc-server serves one client at a time, and localspec's target holds its own) and in the same layout.
    rpc_servers: tuple[str, ...] = ()


class StockComparison:
    """Runs stock tools (subprocesses) and localspec (in process) on the same prompts, interleaved."""

    def __init__(
        self,
        decoder: SpeculativeDecoder,
        tools: dict[str, Path],
        *,
        target: Path,
        draft: Path | None,
        settings: StockSettings,
        progress: ProgressCallback | None = None,
    ) -> None:
        self.target: Model = decoder.target
        self.draft_model = decoder.draft
        self.tools = tools
        self.target_path = target
        self.draft_path = draft
        self.settings = settings
        self.progress = progress or (lambda what, done, total: None)
        self.runner = BenchRunner(
            decoder, BenchSettings(settings.configs, runs=settings.runs, max_tokens=settings.max_tokens)
        )
        model, mtp = decoder.draft is not None, not method_missing(MtpDrafter.source, decoder.controller.missing)
        companion = decoder.head.kind if decoder.head is not None else None
        stock = [e for e in STOCK_ENGINES if (model or not e.uses_draft) and (mtp or not e.uses_head)
                 and e.uses_companion in (None, companion)]
        ours = [localspec_engine(c) for c in self.runner.settings.all_configs]
        servers = [e for e in STOCK_SERVER_ENGINES if model or not e.uses_draft]
        self.engines = stock + ours
        self.completion_engines = servers + ours
        self._every_engine = stock + servers + ours  # the order of the report
        self._servers: dict[Engine, StockServer] = {}

    def engines_for(self, prompt: BenchPrompt) -> list[Engine]:
        return self.completion_engines if prompt.fim is not None else self.engines

    def run(self, prompts: Sequence[BenchPrompt]) -> StockResult:
        prepared = []
        for prompt in prompts:
            self.progress(f"{prompt.workload}/{prompt.id}: preparing", 0, 0)
            # A fresh stock process has an empty KV cache, so localspec starts from one too.
            prepared.append(replace(self.runner.prepare(prompt), cached=0))
        self.progress("warm-up: localspec", 0, 0)
        self.runner.warm_up(prepared[0])
        rounds: list[Round] = []
        passes = self.runner.passes()
        total = len(passes) * self.settings.runs * sum(len(self.engines_for(item.prompt)) for item in prepared)
        done = 0
        for item in prepared:
            if item.prompt.fim is None:
                self._check_prompt_tokens(item)
        try:
            for name in passes:
                for item in prepared:
                    prompt = in_pass(item.prompt, name)
                    for run in range(self.settings.runs):
                        current = Round(prompt)
                        self.runner.learn(name, run)
                        for engine in measuring_order(self.engines_for(item.prompt), len(rounds)):
                            self.progress(f"{prompt.workload}/{prompt.id}: {engine.label}", done, total)
                            current.runs[engine.label] = self._measure(item, engine)
                            done += 1
                        rounds.append(current)
        finally:
            for server in self._servers.values():
                server.close()
            self._servers.clear()
        self.runner.learn(None, 0)
        self.progress("done", total, total)
        used = {label for r in rounds for label in r.runs}
        engines = [e for e in self._every_engine if e.label in used]
        return StockResult(engines, rounds, self.settings.max_tokens)

    def _measure(self, item: PreparedPrompt, engine: Engine) -> EngineRun:
        if not engine.stock:
            measurement = self.runner.measure(item, engine.config)
            stats = measurement.stats
            drafts = engine.config.method != "none"
            return EngineRun(
                self.target.detokenize(measurement.tokens),
                decode_tokens=stats.generated_tokens,
                decode_s=stats.decode_s,
                prefill_tokens=stats.prefill_tokens,
                prefill_s=stats.prefill_s,
                drafted=stats.drafted if drafts else None,
                accepted=stats.accepted if drafts else None,
                stopped=stats.stop_reason == StopReason.EOS,
                position_drafted=tuple(stats.per_position_drafted),
                position_accepted=tuple(stats.per_position_accepted),
            )
        if engine.tool == STOCK_SERVER.tool:
            if engine not in self._servers:
                self.progress(f"starting {engine.label}", 0, 0)
                self._servers[engine] = StockServer(self._server_command(engine))
            run = self._servers[engine].infill(item, self.settings.max_tokens)
            if self.settings.rpc_servers:
                # An rpc-server serves one client at a time: the next stock engine or tool needs them free.
                self._servers.pop(engine).close()
            return run
        if engine == STOCK_BASELINE:
            run = self._run_tool(engine, item, parse_completion)
        else:
            echo = b"".join(self.target.token_bytes(t) for t in item.tokens)
            run = self._run_tool(engine, item, lambda out, log: parse_speculative(out, log, echo, engine.tool))
            # llama-speculative-simple does not print the end-of-generation token; only its count shows it.
            run.stopped = run.decode_tokens < self.settings.max_tokens
        text = self._without_end_of_generation(run.text)
        run.stopped |= text != run.text
        run.text = text
        return run

    def _check_prompt_tokens(self, item: PreparedPrompt) -> None:
        """Stock llama-completion must see exactly localspec's tokens, or the comparison is not like for like."""
        self.progress(f"{item.prompt.workload}/{item.prompt.id}: checking stock tokenization", 0, 0)
        stock = self._run_tool(
            STOCK_BASELINE, item, lambda out, log: parse_prompt_tokens(log), extra=("--verbose-prompt",), max_tokens=1
        )
        if stock != item.tokens:
            at = len(os.path.commonprefix([stock, item.tokens]))
            raise StockOutputError(
                f"stock llama-completion tokenizes prompt {item.prompt.workload}/{item.prompt.id} into other "
                f"tokens than localspec ({len(stock)} vs {len(item.tokens)}, first difference at token {at}); "
                f"the engines would not see the same prompt. Are the tools in {self.tools[STOCK_BASELINE.tool].parent} "
                "built by scripts/build-llama-cpp-stock?"
            )

    def _run_tool(self, engine: Engine, item: PreparedPrompt, parse: Callable[[bytes, str], T], **call) -> T:
        """Run a stock tool and parse its output; again, a few times, when the output lost its last lines."""
        for _ in range(TRUNCATED_ATTEMPTS):
            try:
                return parse(*self._call(engine, item, **call))
            except TruncatedOutputError as exc:
                error = exc
        raise StockOutputError(
            f"{error} in {TRUNCATED_ATTEMPTS} runs: either it is not a build from scripts/build-llama-cpp-stock, "
            "or it lost the end of its log at exit (llama.cpp logs from a background thread; likelier when "
            "the machine is busy)"
        )

    def _call(
        self, engine: Engine, item: PreparedPrompt, *, extra: tuple[str, ...] = (), max_tokens: int | None = None
    ) -> tuple[bytes, str]:
        n = max_tokens or self.settings.max_tokens
        if engine.tool != STOCK_BASELINE.tool:
            n -= 1  # llama-speculative-simple and llama-lookup generate at least n + 1 tokens
        threads = str(self.target.n_threads)
        where = f"{engine.tool} on {item.prompt.workload}/{item.prompt.id}"
        # Stock defaults: no LLAMA_ARG_* overrides, no ggml switches localspec sets for its own build.
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "GGML_"))}
        with tempfile.TemporaryDirectory(prefix="localspec-stock-") as tmp:
            # -f drops one final newline, so add one; --no-escape keeps backslashes in code as they are.
            prompt_file = Path(tmp) / "prompt.txt"
            prompt_file.write_text(item.text + "\n", encoding="utf-8")
            command = [
                str(self.tools[engine.tool]),
                *("-m", str(self.target_path), "-f", str(prompt_file), "--no-escape"),
                *("-n", str(n), "-c", str(self.target.n_ctx), "-t", threads, "-tb", threads, "--temp", "0"),
                *engine.args,
                *extra,
            ]
            # The same offload as localspec's models: stock's default ("auto") may place them otherwise.
            command += ["-ngl", _gpu_layers(self.target.n_gpu_layers), *self._rpc_args()]
            if engine.uses_draft:
                command += ["-md", str(self.draft_path), "-ngld", _gpu_layers(self.draft_model.model.n_gpu_layers)]
            elif engine.uses_companion:  # the head sits beside the target's layers, where they are
                command += ["-md", str(self.draft_path), "-ngld", _gpu_layers(self.target.n_gpu_layers)]
            try:
                done = subprocess.run(command, capture_output=True, env=env, timeout=TOOL_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired as exc:
                limit = f"{TOOL_TIMEOUT_S:.0f} s"
                raise StockOutputError(f"{where} did not finish in {limit}; try fewer --max-tokens") from exc
            except OSError as exc:
                raise StockOutputError(f"cannot run {command[0]}: {exc.strerror}; {BUILD_HINT}") from exc
        log = done.stderr.decode("utf-8", "replace")
        if done.returncode != 0:
            lines = [line for line in log.splitlines() if line.strip()]
            last = lines[-1].strip() if lines else "no message"
            raise StockOutputError(
                f"{where} failed (exit {done.returncode}): {last}; run it by hand to see its whole log"
            )
        return done.stdout, log

    def _server_command(self, engine: Engine) -> list[str]:
        threads = str(self.target.n_threads)
        command = [str(self.tools[engine.tool]), "-m", str(self.target_path), "-c", str(self.target.n_ctx),
                   "-t", threads, "-tb", threads, "-ngl", _gpu_layers(self.target.n_gpu_layers), *self._rpc_args(),
                   *engine.args]
        if engine.uses_draft:
            command += ["-md", str(self.draft_path), "-ngld", _gpu_layers(self.draft_model.model.n_gpu_layers)]
        return command

    def _rpc_args(self) -> list[str]:
        """localspec's RPC layout as stock spells it: the target's top -ngl layers over --rpc, split the same way
        (the draft model stays here, as localspec's does)."""
        layout = self.target.rpc
        if layout is None:
            return []
        return ["--rpc", ",".join(self.settings.rpc_servers),
                "--tensor-split", ",".join(f"{s:g}" for s in layout.server_split())]

    def _without_end_of_generation(self, text: str) -> str:
        """Drop a final end-of-generation token (llama-completion and llama-lookup print it, localspec does not)."""
        tokens = self.target.tokenize(text, add_bos=False, special=True)
        if tokens and self.target.is_end_of_generation(tokens[-1]):
            piece = self.target.detokenize(tokens[-1:])
            if text.endswith(piece):
                return text[: -len(piece)]
        return text


class StockServer:
    """A stock llama-server process on a free loopback port, answering one /infill request at a time."""

    def __init__(self, command: list[str]) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.name = Path(command[0]).name
        self._log = tempfile.TemporaryFile()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_ARG_", "GGML_"))}
        try:
            self._process = subprocess.Popen([*command, "--host", "127.0.0.1", "--port", str(port)], env=env,
                                             stdout=self._log, stderr=subprocess.STDOUT)
        except OSError as exc:
            raise StockOutputError(f"cannot run {command[0]}: {exc.strerror}; {BUILD_HINT}") from exc
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while not self._healthy():
            if self._process.poll() is not None or time.monotonic() > deadline:
                why = self._last_log_line()
                self.close()
                raise StockOutputError(f"{self.name} did not start: {why}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=5) as answer:
                return answer.status == 200
        except OSError:  # refused while it starts; 503 while it loads the model
            return False

    def _last_log_line(self) -> str:
        self._log.seek(0)
        lines = [line for line in self._log.read().decode("utf-8", "replace").splitlines() if line.strip()]
        return lines[-1].strip() if lines else "no output"

    def infill(self, item: PreparedPrompt, max_tokens: int) -> EngineRun:
        fim = item.prompt.fim
        body = {"input_prefix": fim.prefix, "input_suffix": fim.suffix, "prompt": fim.middle,
                "input_extra": [{"filename": c.filename, "text": c.text} for c in fim.chunks],
                "n_predict": max_tokens, "temperature": 0.0, "cache_prompt": False}
        request = urllib.request.Request(self.base + "/infill", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TOOL_TIMEOUT_S) as answer:
                result = json.loads(answer.read())
        except (OSError, ValueError) as exc:
            raise StockOutputError(f"{self.name} /infill on {item.prompt.id} failed: {exc}") from exc
        timings = result["timings"]
        if result["tokens_evaluated"] != len(item.tokens):
            raise StockOutputError(
                f"stock llama-server built a {result['tokens_evaluated']}-token prompt for "
                f"{item.prompt.workload}/{item.prompt.id}, localspec {len(item.tokens)}: not the same prompt")
        drafted = timings.get("draft_n")
        return EngineRun(result["content"], decode_tokens=timings["predicted_n"],
                         decode_s=timings["predicted_ms"] / 1e3, prefill_tokens=timings["prompt_n"],
                         prefill_s=timings["prompt_ms"] / 1e3, drafted=drafted,
                         accepted=timings.get("draft_n_accepted") if drafted is not None else None,
                         stopped=result.get("stop_type") == "eos")

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()


# -- report --------------------------------------------------------------------------------------
def build_rows(result: StockResult) -> list[dict]:
    """One row per workload and engine, and per engine over all workloads when there are several.

    Per prompt: the median over runs (tok/s) or of the per-round ratios to stock llama-completion; then
    the mean (tok/s) or geometric mean (ratios) over prompts. Drafts are pooled over prompts and runs.
    """
    workloads = list(dict.fromkeys(r.prompt.workload for r in result.rounds))
    groups = [(w, [r for r in result.rounds if r.prompt.workload == w]) for w in workloads]
    if len(workloads) > 1:
        groups.append(("all", result.rounds))
    return [_row(name, mine, engine, result.max_tokens) for name, rounds in groups for engine in result.engines
            if (mine := [r for r in rounds if engine.label in r.runs])]


def reference(label: str) -> bool:
    """Whether ``label`` is what the other engines' ratios are against: stock target alone."""
    return label in (STOCK_BASELINE.label, STOCK_SERVER.label)


def overall_rows(rows: list[dict]) -> list[dict]:
    """The rows over every workload: the "all" rows, or the only workload's when there is one (and no "all")."""
    workloads = {row["workload"] for row in rows}
    overall = workloads if len(workloads) == 1 else {"all"}
    return [row for row in rows if row["workload"] in overall]


def _row(workload: str, rounds: list[Round], engine: Engine, max_tokens: int) -> dict:
    by_prompt: dict[tuple[str, str], list[Round]] = {}
    for r in rounds:
        by_prompt.setdefault((r.prompt.workload, r.prompt.id), []).append(r)
    label = engine.label

    def each_prompt(figure: Callable[[Round], float | None]) -> list[list[float]]:
        """Per prompt, the figure of each run that has it (prompts with none left out)."""
        values = ([v for v in map(figure, prompt_rounds) if v is not None] for prompt_rounds in by_prompt.values())
        return [v for v in values if v]

    def per_prompt(figure: Callable[[Round], float | None]) -> list[float]:
        return [median(values) for values in each_prompt(figure)]

    def base(r: Round) -> str:  # stock target alone in this round: llama-server for a completion
        return STOCK_SERVER.label if STOCK_SERVER.label in r.runs else STOCK_BASELINE.label

    def ratio(r: Round, rate: str) -> float | None:
        mine, theirs = getattr(r.runs[label], rate), getattr(r.runs[base(r)], rate)
        return mine / theirs if mine and theirs else None

    decode_ratios = each_prompt(lambda r: ratio(r, "decode_tok_per_s"))
    # One run's decode ratio at its lowest and highest, on the prompt where runs lie furthest apart.
    widest = max(((min(v), max(v)) for v in decode_ratios), key=lambda low_high: low_high[1] / low_high[0],
                 default=None)
    runs = [r.runs[label] for r in rounds]
    drafted = sum(run.drafted or 0 for run in runs)
    accepted = sum(run.accepted or 0 for run in runs)
    differences = []
    for (workload_name, prompt_id), prompt_rounds in by_prompt.items():
        for r in prompt_rounds:
            difference = compare_runs(r.runs[base(r)], r.runs[label])
            if difference is not None:
                differences.append({"prompt": f"{workload_name}/{prompt_id}", **difference.__dict__})
                break
    return {
        "workload": workload,
        "engine": label,
        "stock": engine.stock,
        "prompts": len(by_prompt),
        "runs": len(rounds) // max(1, len(by_prompt)),
        "decode_tok_per_s": _round(_mean(per_prompt(lambda r: r.runs[label].decode_tok_per_s))),
        "prefill_tok_per_s": _round(_mean(per_prompt(lambda r: r.runs[label].prefill_tok_per_s))),
        "decode_ratio": _round(_geomean([median(v) for v in decode_ratios]), 3),
        "prefill_ratio": _round(_geomean(per_prompt(lambda r: ratio(r, "prefill_tok_per_s"))), 3),
        "decode_ratio_range": None if widest is None else [_round(widest[0], 3), _round(widest[1], 3)],
        "drafted": drafted if any(run.drafted is not None for run in runs) else None,
        "accepted": accepted if any(run.accepted is not None for run in runs) else None,
        "acceptance_rate": _round(accepted / drafted, 4) if drafted else None,
        "per_position_acceptance": _per_position(runs),
        "decoded_tokens": _round(_mean(per_prompt(lambda r: r.runs[label].decode_tokens)), 1),
        "past_budget": _round(_mean(per_prompt(lambda r: max(0, r.runs[label].decode_tokens - max_tokens))), 1),
        "choosing_share": _round(_mean(per_prompt(
            lambda r: r.runs[label].choosing_s / r.runs[label].decode_s if r.runs[label].decode_s > 0 else None)), 4),
        "identical": not differences,
        "differences": differences,
    }


def write_json(path: Path, rows: list[dict], meta: dict) -> None:
    try:
        path.write_text(json.dumps({"schema": SCHEMA, **meta, "rows": rows}, indent=2) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from exc


def _gpu_layers(n: int) -> str:
    """localspec's layer count (negative: all) as the stock tools' -ngl takes it (-1 there means "auto")."""
    return "all" if n < 0 else str(n)


def _per_position(runs: list[EngineRun]) -> list[float] | None:
    """P(draft position i accepted | reached), pooled over runs as localspec pools its own stats; None where no
    run reports positions."""
    pooled = GenerationStats.pooled(
        GenerationStats(per_position_drafted=list(run.position_drafted),
                        per_position_accepted=list(run.position_accepted))
        for run in runs
    )
    return [_round(x, 4) for x in pooled.per_position_acceptance] or None


def _mean(values: list[float]) -> float | None:
    return fmean(values) if values else None


def _geomean(values: list[float]) -> float | None:
    return geometric_mean(values) if values else None


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)
