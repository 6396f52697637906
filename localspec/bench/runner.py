"""Runs a benchmark: target alone (the baseline) and each speculative configuration, prompt by prompt.

How figures are kept honest on a shared, noisy machine:

- An untimed warm-up first: every configuration generates a few tokens, which loads the draft model and
  gives every controller its first cost measurements.
- The baseline (method "none", the same target and code path) is measured in the same run as the
  speculative configurations, in lockstep: each configuration has a KV cache of its own on the shared
  weights, and their generations of one prompt advance one round each in turn. A slow spell of the
  machine (on a shared 2-core VM one answer of a few seconds may run 15% slower than the next) then
  hits every configuration alike: target alone against itself measures within 1% this way, against
  15% when the answers run one after another. Each generation's time is its own rounds only.
  Speedup is the ratio of decode tok/s to the baseline's in the same run, prompt by prompt.
- Every timed generation finds the KV caches as a real request would: empty for a one-shot prompt (so
  TTFT is a full prefill, and a draft model pays its own prompt catch-up inside the decode time), and
  holding the earlier turns for the last turn of a multi-turn session.
- Greedy speculative output is compared token by token with the baseline's.
- Next to the measured speedup, the speedup Leviathan et al.'s formula predicts from this run's measured
  acceptance and measured costs: per round, expected tokens 1 + a + ... + a^k for a target pass of k + 1
  tokens plus the drafting, priced by the planner's own rule, against one token per one-token pass. The
  gap is overhead and model error.

Each configuration gets its own decoder (and so its own controller and learned acceptance) over the
shared target and draft weights, so one configuration's beliefs about the text never leak into another's
figures. What the target's passes cost is the machine's, not a method's, and the configurations share it:
priced each from its own few samples, two methods with the same rule for a round part at near-ties by
timing noise alone (on the 2-core Intel Xeon lookup and auto drafted 1 and 2 tokens after the same 2-token
match of code-edit because one had timed a 3-row pass at 1.21 one-row passes and the other at 1.25, and
code-edit's answers then ran 11-17% apart), so the figures would compare each one's noise rather than its
method. For the same reason the passes a turn of the lockstep times are recorded when the turn ends
(``Costs.held``): shared as they are timed, the configuration measured second in a turn would price its
round with a pass the first had just timed (lookup then drafted 13 tokens and auto 5 after the same
11-token match, and their answers ran 11% apart).

A configuration with an answer history (suffix decoding) gets an empty one in memory, never the user's.
With one, the prompts are run twice, in order: a cold pass, where the history learns each prompt's first
answer (so later prompts draw on earlier ones, as in an agent's session), then a warm pass over the same
prompts, where it learns nothing more. The passes are reported as workloads "NAME (cold)" and "NAME (warm)".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from localspec.bench.workloads import BenchPrompt
from localspec.conversation import TEMPLATE_KEY, Conversation
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.decoding.stats import GenerationStats, judged
from localspec.engine.decoding.text import Step
from localspec.engine.llama.model import Model
from localspec.engine.persist.history import HistoryStore
from localspec.engine.planner.controller import Controller
from localspec.engine.planner.costs import Costs
from localspec.engine.planner.estimates import expected_tokens
from localspec.fim import fim_prompt

T = TypeVar("T")

DEFAULT_RUNS = 3
DEFAULT_MAX_TOKENS = 192
DEFAULT_WARMUP_TOKENS = 16
HISTORY_PASSES = ("cold", "warm")
HISTORY_SUFFIX = "+history"  # how --methods names a configuration with an answer history: auto+history

ProgressCallback = Callable[[str, int, int], None]  # (what is running, done, total)


@dataclass(frozen=True)
class Config:
    """One speculative configuration; ``draft_len`` None lets the controller choose (shown as "auto");
    ``history``: with an answer history for suffix decoding (``auto`` only)."""

    method: str
    draft_len: int | None = None
    history: bool = False

    @property
    def label(self) -> str:
        if self.method == "none":
            return "none"
        return f"{self.method}{HISTORY_SUFFIX if self.history else ''} k={self.draft_len or 'auto'}"


BASELINE = Config("none")


@dataclass(frozen=True)
class BenchSettings:
    configs: Sequence[Config]  # the baseline is added first if missing
    runs: int = DEFAULT_RUNS
    max_tokens: int = DEFAULT_MAX_TOKENS
    sampling: SamplingParams = SamplingParams()
    warmup_tokens: int = DEFAULT_WARMUP_TOKENS

    @property
    def all_configs(self) -> list[Config]:
        return [BASELINE, *(c for c in self.configs if c != BASELINE)]


@dataclass(frozen=True)
class FirstDifference:
    """Where a speculative output first leaves the baseline's (a token is None where one output ended)."""

    index: int
    baseline: int | None
    speculative: int | None
    baseline_text: str = ""
    speculative_text: str = ""


@dataclass
class Measurement:
    """One timed generation."""

    tokens: list[int]
    stats: GenerationStats
    speedup: float | None = None  # decode tok/s over the baseline's in the same round; None when unmeasurable
    expected_speedup: float | None = None


@dataclass
class PromptRecord:
    """All runs of one configuration on one prompt."""

    prompt: BenchPrompt
    config: Config
    runs: list[Measurement] = field(default_factory=list)
    difference: FirstDifference | None = None  # first greedy difference from the baseline, if any


@dataclass
class BenchResult:
    settings: BenchSettings
    prompts: list[BenchPrompt]
    records: list[PromptRecord]

    @property
    def greedy(self) -> bool:
        return self.settings.sampling.greedy


@dataclass(frozen=True)
class PreparedPrompt:
    """A prompt rendered to the target's tokens with the chat template (``BenchRunner.prepare``)."""

    prompt: BenchPrompt
    tokens: list[int]
    cached: int  # tokens a real session would already hold in its KV caches (earlier turns)
    text: str = ""  # the templated text ``tokens`` come from (special tokens parsed; a BOS if the model adds one)


def compare_tokens(
    baseline: Sequence[int], speculative: Sequence[int], describe: Callable[[int], str] = lambda t: ""
) -> FirstDifference | None:
    """None when identical, else the first index where they differ (or where the shorter one ended)."""
    for i, (a, b) in enumerate(zip(baseline, speculative)):
        if a != b:
            return FirstDifference(i, a, b, describe(a), describe(b))
    if len(baseline) == len(speculative):
        return None
    i = min(len(baseline), len(speculative))
    a = baseline[i] if i < len(baseline) else None
    b = speculative[i] if i < len(speculative) else None
    return FirstDifference(i, a, b, "" if a is None else describe(a), "" if b is None else describe(b))


def expected_speedup(steps: Sequence[Step], controller: Controller) -> float | None:
    """Leviathan's predicted speedup for these rounds, from their measured acceptance and the costs
    ``controller`` knows (the target's passes as the configurations measured them together), each round
    priced as the planner prices it (``Controller.round_seconds``).

    ``steps`` are the verification rounds (not the prefill step). Acceptance per source is the
    geometric-model estimate accepted / judged, where a round judges the drafts up to the first rejection.
    """
    accepted: dict[str, int] = {}
    judged_by_source: dict[str, int] = {}
    for step in steps:
        if step.drafted:
            accepted[step.source] = accepted.get(step.source, 0) + step.accepted
            judged_by_source[step.source] = judged_by_source.get(step.source, 0) + judged(step.drafted, step.accepted)
    tokens = seconds = 0.0
    for step in steps:
        k = step.drafted
        round_s = controller.round_seconds(step.source, k)
        if round_s is None:
            return None
        acceptance = accepted.get(step.source, 0) / judged_by_source[step.source] if k else 0.0
        tokens += expected_tokens([acceptance] * k)[k]
        seconds += round_s
    return tokens * controller.costs.one / seconds if seconds > 0 else None


class BenchRunner:
    """Benchmarks the configurations of ``settings`` on the target and draft of ``decoder``."""

    def __init__(
        self, decoder: SpeculativeDecoder, settings: BenchSettings, *, progress: ProgressCallback | None = None
    ) -> None:
        self.settings = settings
        self.progress = progress or (lambda what, done, total: None)
        # The baseline runs on the given caches, every other configuration on caches of its own; where the
        # given ones keep a head's inputs on every pass, so does the baseline's target alone (~1% of a
        # SmolLM2 pass for an EAGLE-3 head's three layers), and it is not the target alone.
        keeps = decoder.target.keeps_head_inputs
        self.decoders = {
            config: decoder.sibling(
                method=config.method,
                draft_len=config.draft_len,
                history=HistoryStore(None) if config.history else None,
                own_caches=config != BASELINE or keeps,
            )
            for config in settings.all_configs
        }
        self.target = self.decoders[BASELINE].target  # the caches the prompts are prepared on
        self.learn(None, 0)

    def close(self) -> None:
        """Free the configurations' decoders (their own caches and drafters); the given decoder stays open."""
        for decoder in self.decoders.values():
            decoder.close()

    def passes(self) -> tuple[str | None, ...]:
        """The passes over the prompts: cold then warm with an answer history (see the module docstring)."""
        return HISTORY_PASSES if any(config.history for config in self.settings.all_configs) else (None,)

    def learn(self, pass_name: str | None, run: int) -> None:
        """Let the answer histories learn the next answers if they are a prompt's first in the cold pass
        (``learn(None, 0)``: learn nothing, as in the warm-up)."""
        for decoder in self.decoders.values():
            if decoder.history is not None:
                decoder.history.learning = pass_name == HISTORY_PASSES[0] and run == 0

    def run(self, prompts: Sequence[BenchPrompt]) -> BenchResult:
        prepared = [self.prepare(prompt) for prompt in prompts]
        self.warm_up(prepared[0])
        configs = self.settings.all_configs
        passes = self.passes()
        records: dict[tuple, PromptRecord] = {}
        shown = []
        total, done = len(passes) * len(prepared) * self.settings.runs * len(configs), 0
        rounds = 0
        for name in passes:
            for item in prepared:
                prompt = in_pass(item.prompt, name)
                shown.append(prompt)
                for run in range(self.settings.runs):
                    self.progress(f"{prompt.workload}/{prompt.id}: run {run + 1}", done, total)
                    self.learn(name, run)
                    by_config = self.measure_together(item, measuring_order(configs, rounds))
                    rounds += 1
                    done += len(configs)
                    self._relate(prompt, by_config, records)
        self.learn(None, 0)
        self.progress("done", total, total)
        return BenchResult(self.settings, shown, list(records.values()))

    # -- preparation -----------------------------------------------------------------------------
    def prepare(self, prompt: BenchPrompt) -> PreparedPrompt:
        """Render the prompt with the chat template; for multi-turn, the baseline answers the earlier turns; a
        code completion is llama-server's /infill prompt (which stock tools cannot take as text: ``text`` "")."""
        if prompt.fim is not None:
            return PreparedPrompt(prompt, fim_prompt(self.target, prompt.fim, n_ctx=self.target.n_ctx), 0)
        baseline = self.decoders[BASELINE]
        chat = bool(self.target.metadata.get(TEMPLATE_KEY))
        conversation = Conversation(baseline, system=prompt.system, chat=chat)
        max_tokens = self.settings.max_tokens
        cached = 0
        for turn in prompt.turns[:-1]:
            self.progress(f"{prompt.workload}/{prompt.id}: answering turn {len(conversation.messages) // 2 + 1}", 0, 0)
            # A longer budget for the history, so the code the last turn asks about again is complete.
            for _ in conversation.ask(turn, max_tokens=2 * max_tokens, sampling=SamplingParams()):
                pass
        conversation.messages.append({"role": "user", "content": prompt.turns[-1]})
        tokens = conversation.prompt_tokens(reserve=max_tokens)
        if len(prompt.turns) > 1:
            cached = self.target.common_prefix(tokens)  # what the chat's KV cache holds after the last answer
        return PreparedPrompt(prompt, tokens, cached, conversation.render_text()[0])

    def warm_up(self, item: PreparedPrompt) -> None:
        """Untimed: load the draft, let every controller measure its first costs, warm llama.cpp's buffers."""
        for config, decoder in self.decoders.items():
            self.progress(f"warm-up: {config.label}", 0, 0)
            if decoder.draft is not None:
                decoder.draft.model  # noqa: B018 - loads it now rather than inside a timed generation
            self._prime(item, config)  # only once: later warm-ups reuse the cached prompt, as they need no figures
            for _ in decoder.generate(
                item.tokens, max_tokens=self.settings.warmup_tokens, sampling=self.settings.sampling
            ):
                pass

    def _models(self, config: Config) -> list[Model]:
        decoder = self.decoders[config]
        draft = decoder.draft
        return [decoder.target] + ([draft.model] if draft is not None and draft.loaded else [])

    def _prime(self, item: PreparedPrompt, config: Config) -> None:
        """Make the KV caches of ``config`` hold exactly the part of the prompt a real request would find cached."""
        for model in self._models(config):
            keep = min(model.common_prefix(item.tokens), item.cached)
            model.rollback(keep)
            if keep < item.cached:
                model.eval(item.tokens[keep : item.cached], n_logits=0)

    # -- measuring -------------------------------------------------------------------------------
    def measure(self, item: PreparedPrompt, config: Config) -> Measurement:
        """One timed generation of ``config`` on ``item``, from the KV caches a real request would find."""
        return self.measure_together(item, [config])[config]

    def measure_together(self, item: PreparedPrompt, configs: Sequence[Config]) -> dict[Config, Measurement]:
        """One timed generation per configuration on ``item``, advanced in lockstep, a round each in turn
        (in the order given), each from the KV caches a real request would find."""
        for config in configs:
            self._prime(item, config)
        settings = self.settings
        generations = [
            self.decoders[config].generate(item.tokens, max_tokens=settings.max_tokens, sampling=settings.sampling)
            for config in configs
        ]
        # Every configuration's costs are the baseline's (see the module docstring).
        steps = dict(zip(configs, in_lockstep(generations, self.decoders[BASELINE].controller.costs)))
        return {config: self._measurement(config, steps[config]) for config in configs}

    def _measurement(self, config: Config, steps: list[Step]) -> Measurement:
        decoder = self.decoders[config]
        tokens = [t for step in steps for t in step.tokens]
        measurement = Measurement(tokens, decoder.stats)
        if config != BASELINE:
            measurement.expected_speedup = expected_speedup(steps[1:], decoder.controller)
        return measurement

    def _describe(self, token: int) -> str:
        return self.target.detokenize([token])

    def _relate(
        self, prompt: BenchPrompt, by_config: dict[Config, Measurement], records: dict[tuple, PromptRecord]
    ) -> None:
        """File one round's measurements: speedup against this round's baseline, greedy output against it."""
        baseline = by_config[BASELINE]
        base_rate = baseline.stats.decode_tok_per_s
        for config, measurement in by_config.items():
            record = records.setdefault((prompt.id, prompt.workload, config), PromptRecord(prompt, config))
            rate = measurement.stats.decode_tok_per_s
            measurement.speedup = rate / base_rate if base_rate > 0 and rate > 0 else None
            record.runs.append(measurement)
            if self.settings.sampling.greedy and record.difference is None and config != BASELINE:
                record.difference = compare_tokens(baseline.tokens, measurement.tokens, self._describe)


def in_lockstep(generations: Sequence[Iterator[Step]], costs: Costs) -> list[list[Step]]:
    """Each generation's steps, the generations advanced a round each in turn until all have ended. They
    share ``costs``, and the passes a turn times are recorded when it ends (``Costs.held``), so every
    generation prices the rounds of a turn with the same figures."""
    steps: list[list[Step]] = [[] for _ in generations]
    running = list(range(len(generations)))
    while running:
        with costs.held():
            for i in list(running):
                step = next(generations[i], None)
                if step is None:
                    running.remove(i)
                else:
                    steps[i].append(step)
    return steps


def in_pass(prompt: BenchPrompt, name: str | None) -> BenchPrompt:
    """The prompt as reported in pass ``name`` (None: the only pass)."""
    return prompt if name is None else replace(prompt, workload=f"{prompt.workload} ({name})")


def measuring_order(items: Sequence[T], round_index: int) -> list[T]:
    """The order the ``round_index``-th round of a bench measures its configurations or engines in: shifted
    every round, across prompts as well as runs, so that none always goes first or last (with one run per
    prompt, a shift per run alone would measure the same one first on every prompt)."""
    shift = round_index % len(items)
    return [*items[shift:], *items[:shift]]
