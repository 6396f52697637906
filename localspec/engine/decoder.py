"""The draft-and-verify loop: one target pass per round over [last token + drafts].

``SpeculativeDecoder.generate`` yields a ``Step`` per round with each emitted token's provenance.
Whatever way the loop ends (EOS, max tokens, a consumer that stops early, Ctrl-C, an error), the
``finally`` block leaves the target's KV cache holding exactly the emitted context, and the draft's
a prefix of it, so the next generation can reuse both.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from localspec.engine.acceptance import verify_greedy, verify_sampled
from localspec.engine.backend import LlamaModel, common_prefix_length
from localspec.engine.controller import Controller, Plan
from localspec.engine.history import HistoryStore
from localspec.engine.lookup import PromptLookupProposer
from localspec.engine.pass_costs import PassCostMemory
from localspec.engine.proposers import Draft, DraftModelProposer
from localspec.engine.sampling import ProbabilityRows, SamplingParams, probabilities, sample
from localspec.engine.stats import GenerationStats
from localspec.engine.suffix import SuffixDraft
from localspec.errors import ContextFullError, UsageError

if TYPE_CHECKING:  # llguidance loads only for generations that use a grammar
    from localspec.engine.constraints import GrammarConstraint

# Matching suffixes up to 8 tokens tells a copy in progress (long matches) from chance (short ones).
LOOKUP_MAX_NGRAM = 8


@dataclass
class Step:
    """What one round emitted."""

    tokens: list[int]
    sources: list[str]  # per token: "target", "draft", "lookup", "suffix" or "grammar" (forced)
    method: str  # "none", "lookup", "suffix", "draft" or "grammar"
    drafted: int
    accepted: int


class SpeculativeDecoder:
    """Generates with a target model, speculating with prompt lookup and/or a draft model.

    Args:
        target: the model whose output is reproduced exactly.
        draft: optional draft-model proposer (same tokenizer).
        method, draft_len: see ``Controller``.
        draft_cost_ratio: prior guess of a draft step's cost relative to a target step.
        draft_load_s: prior guess of the seconds loading the draft model takes (it loads on first use).
        pass_costs: where the target's pass costs are remembered from one session to the next.
        history: earlier answers for suffix decoding (``auto`` only); each answer is added to it.
    """

    def __init__(
        self,
        target: LlamaModel,
        *,
        draft: DraftModelProposer | None = None,
        method: str = "auto",
        draft_len: int | None = None,
        draft_cost_ratio: float = 0.5,
        draft_load_s: float = 0.0,
        pass_costs: PassCostMemory | None = None,
        history: HistoryStore | None = None,
    ) -> None:
        self.target = target
        self.draft = draft
        self.lookup = PromptLookupProposer(max_ngram=LOOKUP_MAX_NGRAM)
        self.controller = Controller(
            method,
            draft_len=draft_len,
            has_draft_model=draft is not None,
            draft_cost_ratio=draft_cost_ratio,
            draft_load_s=0.0 if draft is None or draft.loaded else draft_load_s,
            rollback_window=target.memory_plan.rollback_window,
            speculation_off=target.memory_plan.refused,
        )
        self.pass_costs = pass_costs
        if pass_costs is not None:
            self.controller.remember(pass_costs.load())
        self.stats = GenerationStats()
        self.history = history
        self.constraint: GrammarConstraint | None = None  # the running generation's grammar, if any

    def _sync_lookup(self, context: Sequence[int]) -> None:
        """Make the lookup history equal ``context``, keeping the index of the common prefix."""
        seen = self.lookup.history
        keep = common_prefix_length(seen, context)
        if keep < len(seen):
            self.lookup.truncate(keep)
        self.lookup.extend(context[keep:])

    def generate(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        prefill_progress: Callable[[int, int], None] | None = None,
        constraint: GrammarConstraint | None = None,
    ) -> Iterator[Step]:
        """Yield the rounds of one generation continuing ``prompt`` (the full context, token ids).

        The common prefix with what the target's KV cache already holds is not evaluated again.
        ``constraint``: a grammar every emitted token must follow (see constraints.py).
        """
        if not prompt:
            raise UsageError("empty prompt: give some text to continue")
        target = self.target
        if len(prompt) >= target.n_ctx:
            raise ContextFullError(
                f"prompt is {len(prompt)} tokens but the context window is {target.n_ctx}; "
                "use a larger --ctx or a shorter prompt"
            )
        stats = self.stats = GenerationStats(
            prompt_tokens=len(prompt), kernels=target.kernels, memory=target.memory_plan.describe()
        )
        rng = np.random.default_rng(sampling.seed)
        start = perf_counter()
        replayed = target.replayed_tokens
        keep = min(target.common_prefix(prompt), len(prompt) - 1)
        target.rollback(keep)  # a recurrent state may have to evaluate part of the prefix again
        self._sync_lookup(prompt)
        logits = target.eval(prompt[keep:], n_logits=1, progress=prefill_progress, prefill=True)[0]
        stats.prefill_tokens = len(prompt) - keep + target.replayed_tokens - replayed
        stats.prefill_s = perf_counter() - start
        if target.large_eval is not None:
            # A measured pass larger than most drafts anchors what long drafts cost; on a CPU they can
            # be far cheaper per token than short ones (llama.cpp switches kernels for larger batches).
            self.controller.record_pass(*target.large_eval)

        context = list(prompt)
        self.constraint = constraint
        try:
            if constraint is not None:
                constraint.restrict(logits[None, :])
            token = int(np.argmax(logits)) if sampling.greedy else sample(probabilities(logits, sampling), rng)
            stats.record_round("none", 0, 0)  # the prefill pass produced the first token
            step = self._emit(context, Step([token], ["target"], "none", 0, 0), max_tokens)
            stats.first_token_s = perf_counter() - start
            yield step
            while stats.stop_reason is None:
                step = self._round(context, max_tokens, sampling, rng)
                if step is not None:
                    yield step
        finally:
            # The last emitted token is never in the KV cache: the next round (or turn) evaluates it.
            target.rollback(min(target.n_past, len(context) - 1))
            stats.replayed_tokens = target.replayed_tokens - replayed
            if self.draft is not None:
                self.draft.sync(context)
            stats.controller = self.controller.costs()
            if self.pass_costs is not None:
                self.pass_costs.save(self.controller.relative_costs())
            stats.draft_status = self.controller.draft_status()
            if self.history is not None:
                self.history.add(prompt, context[len(prompt) :])
            self.constraint = None

    def _round(
        self, context: list[int], max_tokens: int, sampling: SamplingParams, rng: np.random.Generator
    ) -> Step | None:
        stats, target, controller = self.stats, self.target, self.controller
        round_start = perf_counter()
        room = target.n_ctx - target.n_past - 1  # drafts that fit after [last token]
        if room < 0:
            stats.stop_reason = "context_full"
            return None
        forced = self.constraint.forced() if self.constraint is not None and controller.method != "none" else []
        lookup_tokens = self.lookup.propose(controller.lookup_max) if controller.method != "none" else []
        suffix = SuffixDraft([], 0, [])
        if self.history is not None and controller.method == "auto" and not forced:
            suffix = self.history.index.propose(context, controller.lookup_max)
        plan: Plan = Plan("grammar", len(forced), len(forced), 0.0) if forced else controller.plan(
            lookup_available=len(lookup_tokens),
            lookup_match_len=self.lookup.last_match_len,
            suffix_available=len(suffix.tokens),
            suffix_match_len=suffix.match_len,
            draft_catch_up=lambda: self.draft.catch_up(context),
            generated=stats.generated_tokens,
            remaining=max_tokens - stats.generated_tokens,
        )
        k = max(0, min(plan.k, room, max_tokens - stats.generated_tokens - 1))
        draft_s = 0.0
        if plan.method == "grammar" and k:
            draft = Draft(forced[:k], None, "grammar")  # tokens the grammar forces: drafted for free
        elif plan.method == "lookup" and k:
            draft = Draft(lookup_tokens[:k], None, "lookup")
        elif plan.method == "suffix" and k:
            draft = Draft(suffix.tokens[:k], None, "suffix")
        elif plan.method == "draft" and k:
            t = perf_counter()
            draft = self.draft.propose(context, k, sampling, rng, constraint=self.constraint)
            draft_s = perf_counter() - t
            controller.record_draft(draft.catch_up_tokens, draft.catch_up_s, draft.steps, draft.steps_s)
        else:
            draft = Draft([], None, "none")

        batch = [context[-1], *draft.tokens]
        rollback_s = 0.0
        if not target.can_remove(len(draft.tokens)):
            rollback_s = target.checkpoint()
            controller.record_checkpoint(rollback_s)
        t = perf_counter()
        logits = target.eval(batch, n_logits=len(batch))
        verify_s = perf_counter() - t
        controller.record_pass(len(batch), verify_s)
        if self.constraint is not None:
            self.constraint.restrict(logits, draft.tokens)
        if sampling.greedy:
            accepted, token = verify_greedy(draft.tokens, logits.argmax(axis=1))
        else:
            accepted, token = verify_sampled(draft.tokens, draft.q, ProbabilityRows(logits, sampling), rng)

        drafted = len(draft.tokens)
        method = draft.source if drafted else "none"
        if method != "grammar":  # forced drafts say nothing about how well lookup or the draft model guess
            match_len = suffix.match_len if method == "suffix" else self.lookup.last_match_len
            controller.record_round(method, match_len, drafted, accepted)
        if method == "suffix":
            self.history.record(suffix.sources[:drafted], accepted)
        stats.record_round(method, drafted, accepted)
        stats.draft_s += draft_s
        stats.verify_s += verify_s
        step = Step(
            draft.tokens[:accepted] + [token], [draft.source] * accepted + ["target"], method, drafted, accepted
        )
        step = self._emit(context, step, max_tokens)
        # Rejected drafts (and, after an end of generation, accepted ones) leave the cache; the new last
        # token is evaluated by the next round.
        replayed = target.replayed_tokens
        restore_s = target.rollback(len(context) - 1)
        if target.replayed_tokens > replayed:
            controller.record_restore(restore_s, target.replayed_tokens - replayed)
        rollback_s += restore_s
        stats.rollback_s += rollback_s
        overhead = perf_counter() - round_start - draft_s - verify_s - rollback_s
        stats.overhead_s += overhead
        controller.record_overhead(overhead)
        return step

    def _emit(self, context: list[int], step: Step, max_tokens: int) -> Step:
        """Cut the step at an end-of-generation token or the token budget, and append it to the context."""
        stats = self.stats
        for i, token in enumerate(step.tokens):
            if self.target.is_end_of_generation(token):
                stats.stop_reason = "eos"
                del step.tokens[i:], step.sources[i:]
                break
        budget = max_tokens - stats.generated_tokens
        if len(step.tokens) >= budget:
            del step.tokens[budget:], step.sources[budget:]
            stats.stop_reason = stats.stop_reason or "length"
        context.extend(step.tokens)
        self.lookup.extend(step.tokens)
        if self.constraint is not None:
            self.constraint.advance(step.tokens)
        stats.generated_tokens += len(step.tokens)
        return step
