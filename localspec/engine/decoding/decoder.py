"""The draft-and-verify loop: one target pass per round over [last token + drafts].

``SpeculativeDecoder.generate`` yields a ``Step`` per round with each emitted token's provenance. Each
round reads: plan (the drafters' offers, priced by the controller), draft, verify, accept, emit, roll
back, record. Whatever way the loop ends (EOS, max tokens, a consumer that stops early, Ctrl-C, an
error), the ``finally`` block leaves the target's KV cache holding the emitted context but its last token
(which the next round or turn evaluates), and the draft model's a prefix of it, so the next generation
can reuse both.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Sequence
from time import perf_counter
from typing import TYPE_CHECKING

import numpy as np

from localspec.engine.decoding.acceptance import verify_greedy, verify_sampled
from localspec.engine.decoding.sampling import ProbabilityRows, SamplingParams, probabilities, sample
from localspec.engine.decoding.stats import GenerationStats, Idle, StopReason
from localspec.engine.decoding.target import Target
from localspec.engine.decoding.text import Step, TextPiece, stream_text
from localspec.engine.drafters.base import FORCED, MODEL, NO_DRAFT, TARGET, TARGET_ALONE, BaseDrafter, Draft, RoundState
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.drafters.registry import DrafterInputs, make_drafters, missing_drafters, uses
from localspec.engine.persist.history import HistoryStore
from localspec.engine.planner.controller import Controller, Plan
from localspec.engine.planner.costs import DEFAULT_DRAFT_COST_RATIO, Costs, output_share
from localspec.errors import PromptTooLong, UsageError
from localspec.gguf.heads import HeadFile

if TYPE_CHECKING:  # llguidance loads only for generations that use a grammar
    from localspec.engine.decoding.constraints import GrammarConstraint


class SpeculativeDecoder:
    """Generates with a target model, speculating with whatever drafters the controller finds worth it.

    Args:
        target: the model whose output is reproduced exactly.
        draft: optional draft-model proposer (same tokenizer).
        method, draft_len: see ``Controller``.
        draft_cost_ratio: prior guess of a draft step's cost relative to a target step.
        draft_load_s: prior guess of the seconds loading the draft model takes (it loads on first use).
        history: earlier answers for suffix decoding (``auto`` only); each answer is added to it.
        head: a companion head to draft with (methods eagle3 or dflash, as its kind, and auto).
        on_answer: called once each generation has ended (the session saves what was learnt).
        clock: what the decoder times its work with (a replay passes a simulated one).
        costs: the target's measured costs to share with another decoder on it (``sibling``), or None.
    """

    def __init__(
        self,
        target: Target,
        *,
        draft: DraftModelDrafter | None = None,
        method: str = "auto",
        draft_len: int | None = None,
        draft_cost_ratio: float = DEFAULT_DRAFT_COST_RATIO,
        draft_load_s: float = 0.0,
        history: HistoryStore | None = None,
        on_answer: Callable[[], None] | None = None,
        head: HeadFile | None = None,
        clock: Callable[[], float] = perf_counter,
        costs: Costs | None = None,
    ) -> None:
        self.target = target
        self.draft = draft
        self.head = head
        self.history = history
        inputs = DrafterInputs(target, draft, history, method, head)
        self.drafters: list[BaseDrafter] = make_drafters(inputs)
        self.controller = Controller(
            method,
            draft_len=draft_len,
            has_draft_model=draft is not None,
            draft_cost_ratio=draft_cost_ratio,
            draft_load_s=0.0 if draft is None or draft.loaded else draft_load_s,
            rollback_window=target.memory_plan.rollback_window,
            speculation_off=target.memory_plan.refused,
            step_cost_ratios={d.source: d.cost_ratio for d in self.drafters if d.cost_ratio is not None},
            missing=missing_drafters(inputs, self.drafters),
            costs=costs,
        )
        self._draft_priors = (draft_cost_ratio, draft_load_s)
        self.on_answer = on_answer
        self.clock = clock
        self.owns_target = False  # the caller made the target, and closes it
        self.stats = GenerationStats()
        self.constraint: GrammarConstraint | None = None  # the running generation's grammar, if any

    def drafter(self, source: str) -> BaseDrafter:
        return next(d for d in self.drafters if d.source == source)

    def close(self) -> None:
        """Free what the drafters hold beside the target (a draft model's or a head's context), and the
        target's context where this decoder made it (a sibling's own caches)."""
        for drafter in self.drafters:
            drafter.close()
        if self.owns_target:
            self.target.close()

    def sibling(
        self, *, method: str, draft_len: int | None, history: HistoryStore | None, own_caches: bool = True
    ) -> SpeculativeDecoder:
        """A decoder on the same weights (a draft model only where ``method`` may use one), sharing this
        one's measured target costs (the machine's and the target's, whichever method times them); with
        ``own_caches``, on a target context of its own."""
        ratio, load_s = self._draft_priors
        draft = self.draft.another() if self.draft is not None and uses(method, DraftModelDrafter.source) else None
        target = self.target.another_context() if own_caches else self.target
        head = self.head if self.head is not None and uses(method, self.head.kind) else None
        other = SpeculativeDecoder(target, draft=draft, method=method, draft_len=draft_len, draft_cost_ratio=ratio,
                                   draft_load_s=load_s, history=history, head=head, clock=self.clock,
                                   costs=self.controller.costs)
        other.owns_target = own_caches
        return other

    def generate(
        self,
        prompt: Sequence[int],
        *,
        max_tokens: int,
        sampling: SamplingParams = SamplingParams(),
        prefill_progress: Callable[[int, int], None] | None = None,
        constraint: GrammarConstraint | None = None,
    ) -> Iterator[Step]:
        """The rounds of one generation continuing ``prompt`` (the full context, token ids).

        The common prefix with what the target's KV cache already holds is not evaluated again.
        ``constraint``: a grammar every emitted token must follow (see constraints.py). Raises
        ``PromptTooLong`` at once (not at the first step) when the prompt leaves no room to answer.
        """
        if not prompt:
            raise UsageError("empty prompt: give some text to continue")
        if len(prompt) >= self.target.n_ctx:
            raise PromptTooLong(len(prompt), self.target.n_ctx)
        return self._generate(prompt, max_tokens, sampling, prefill_progress, constraint)

    def stream(self, prompt: Sequence[int], *, stop: Sequence[str] = (), **generate) -> Iterator[TextPiece]:
        """``generate`` as text, ending at the first stop string (which the stats then give as the reason)."""
        return self._text(self.generate(prompt, **generate), stop)

    def _text(self, steps: Iterator[Step], stop: Sequence[str]) -> Iterator[TextPiece]:
        for piece in stream_text(self.target, steps, stop=stop):
            if piece.stop:
                self.stats.stop_reason = StopReason.STOP_STRING  # the round may also have used up the budget
            yield piece

    def _generate(self, prompt, max_tokens, sampling, prefill_progress, constraint) -> Iterator[Step]:
        target = self.target
        stats = self.stats = GenerationStats(
            prompt_tokens=len(prompt), kernels=target.kernels, memory=target.memory_plan.describe(),
            memory_kind=target.memory_plan.memory.value,
        )
        rng = np.random.default_rng(sampling.seed)
        start = self.clock()
        replayed = target.replayed_tokens
        keep = min(target.common_prefix(prompt), len(prompt) - 1)
        target.rollback(keep)  # a recurrent state may have to evaluate part of the prefix again
        for drafter in self.drafters:
            drafter.begin(prompt)
        self.controller.begin_answer()
        logits = target.eval(prompt[keep:], n_logits=1, progress=prefill_progress, prefill=True)[0]
        stats.prefill_tokens = len(prompt) - keep + target.replayed_tokens - replayed
        stats.prefill_s = self.clock() - start
        self.controller.costs.prompt_evaluated()
        if target.large_eval is not None:
            # A large prompt pass hints at what long drafts cost; on a CPU they can be far cheaper per
            # token than short ones (llama.cpp switches kernels for larger batches).
            (size, seconds), target.large_eval = target.large_eval, None
            share = output_share(target.n_vocab, target.n_embd_out, target.n_params)
            self.controller.costs.record_prefill(size, seconds, share)

        context = list(prompt)
        self.constraint = constraint
        # What is alive when the rounds start (the vocabulary, indexes, earlier answers) stays out of the
        # garbage collector's scans until the answer ends: a full collection over it took 46 ms mid-answer,
        # three one-token passes of SmolLM2-135M on the 2-core AMD EPYC (far more on a GPU). Given back
        # after each answer, so the process's garbage cycles are still collected between answers.
        gc.freeze()
        try:
            if constraint is not None:
                constraint.restrict(logits[None, :])
            token = int(np.argmax(logits)) if sampling.greedy else sample(probabilities(logits, sampling), rng)
            stats.record_round(TARGET_ALONE, 0, 0)  # the prefill pass produced the first token
            step = self._emit(context, Step([token], [TARGET], TARGET_ALONE, 0, 0), max_tokens)
            stats.first_token_s = self.clock() - start
            yield step
            while stats.stop_reason is None:
                step = self._round(context, max_tokens, sampling, rng)
                if step is not None:
                    yield step
        finally:
            gc.unfreeze()
            target.rollback(min(target.n_past, len(context) - 1))
            stats.replayed_tokens = target.replayed_tokens - replayed
            for drafter in self.drafters:
                drafter.end(context)
            if self.history is not None:  # kept whatever the method, for the runs that draft from it later
                self.history.add(prompt, context[len(prompt) :])
            stats.controller = self.controller.beliefs()
            stats.draft_status = self.controller.draft_status()
            self.constraint = None
            if self.on_answer is not None:
                self.on_answer()

    def _round(
        self, context: list[int], max_tokens: int, sampling: SamplingParams, rng: np.random.Generator
    ) -> Step | None:
        started = self.clock()
        room = self.target.n_ctx - self.target.n_past - 1  # drafts that fit after [last token]
        if room < 0:
            self.stats.stop_reason = StopReason.CONTEXT_FULL
            return None
        budget = max_tokens - self.stats.generated_tokens
        # Plan: the drafters this method allows say what they could draft; the controller prices it.
        controller = self.controller
        state = RoundState(context, controller.draft_limit, sampling, rng, self.constraint)
        offers = (
            offer for d in self.drafters if controller.allows(d.source) and (offer := d.offer(state)) is not None
        )
        plan = controller.plan(offers, generated=self.stats.generated_tokens, remaining=budget,
                               last_rows=self.target.last_rows)
        k = max(0, min(plan.k, room, budget - 1))
        # Draft.
        drafter = self.drafter(plan.source) if k else None
        drafting = self.clock()
        draft = drafter.draft(plan.offer, k, state) if drafter is not None else NO_DRAFT
        draft_s = self.clock() - drafting
        # Verify: one target pass over the last token and the drafts.
        logits, verify_s, rollback_s = self._verify(context[-1], draft)
        # Accept.
        if sampling.greedy:
            accepted, token = verify_greedy(draft.tokens, logits.argmax(axis=1))
        else:
            accepted, token = verify_sampled(draft.tokens, draft.q, ProbabilityRows(logits, sampling), rng)
        drafted = len(draft.tokens)
        source = draft.source if drafted else TARGET_ALONE
        # Emit, then roll the rejected drafts (and after an end of generation, accepted ones) back out.
        tokens = draft.tokens[:accepted] + [token]
        step = self._emit(context, Step(tokens, [draft.source] * accepted + [TARGET], source, drafted, accepted),
                          max_tokens)
        rollback_s += self._roll_back(context)
        # Record.
        self._record(plan, drafter, draft, accepted, source, step.tokens)
        stats = self.stats
        stats.draft_s += draft_s
        stats.verify_s += verify_s
        stats.rollback_s += rollback_s
        elapsed = self.clock() - started
        overhead = elapsed - draft_s - verify_s - rollback_s
        stats.overhead_s += overhead
        controller.overheads.record(overhead, drafted=drafted > 0)
        # A priced plan carried out as priced (a probe's figures are its hopes, not its expectation).
        if plan.expected_rate > 0 and k == plan.k and not plan.explored:
            stats.record_plan(plan.source, plan.expected_tokens, plan.expected_tokens / plan.expected_rate,
                              accepted + 1, elapsed)
        return step

    def _verify(self, last: int, draft: Draft) -> tuple[np.ndarray, float, float]:
        """(logits of every row, seconds of the pass, seconds saving a checkpoint first if one is needed)."""
        target, costs = self.target, self.controller.costs
        checkpoint_s = 0.0
        if not target.can_remove(len(draft.tokens)):
            checkpoint_s = target.checkpoint()
            costs.record_checkpoint(checkpoint_s)
        started = self.clock()
        logits = target.eval([last, *draft.tokens], n_logits=len(draft.tokens) + 1)
        verify_s = self.clock() - started
        costs.record_pass(len(draft.tokens) + 1, verify_s)
        if self.constraint is not None:
            self.constraint.restrict(logits, draft.tokens)
        return logits, verify_s, checkpoint_s

    def _roll_back(self, context: list[int]) -> float:
        """Leave the target's cache holding ``context`` but its last token; returns the seconds it took."""
        target = self.target
        replayed = target.replayed_tokens
        seconds = target.rollback(len(context) - 1)
        if target.replayed_tokens > replayed:
            self.controller.costs.record_restore(seconds, target.replayed_tokens - replayed)
        return seconds

    def _record(self, plan: Plan, drafter: BaseDrafter | None, draft: Draft, accepted: int, source: str,
                emitted: Sequence[int]) -> None:
        """Tell the controller, the drafter and the stats how the round went."""
        drafted = len(draft.tokens)
        if drafter is not None and drafter.kind == MODEL:
            self.controller.record_draft(
                drafter.source, draft.catch_up_tokens, draft.catch_up_s, draft.steps, draft.steps_s
            )
        # Forced drafts say nothing about how well the other drafters guess.
        if drafter is None or drafter.kind != FORCED:
            self.controller.record_round(source, drafted, accepted, emitted)
        if drafted:
            drafter.judged(plan.offer, draft, accepted)
        idle = None if drafted else plan.idle or (Idle.UNSURE if drafter is not None else None)
        self.stats.record_round(source, drafted, accepted, idle=idle, explored=plan.explored)

    def _emit(self, context: list[int], step: Step, max_tokens: int) -> Step:
        """Cut the step at an end-of-generation token or the token budget, and append it to the context."""
        stats = self.stats
        for i, token in enumerate(step.tokens):
            if self.target.is_end_of_generation(token):
                stats.stop_reason = StopReason.EOS
                del step.tokens[i:], step.sources[i:]
                break
        budget = max_tokens - stats.generated_tokens
        if len(step.tokens) >= budget:
            del step.tokens[budget:], step.sources[budget:]
            stats.stop_reason = stats.stop_reason or StopReason.LENGTH
        context.extend(step.tokens)
        for drafter in self.drafters:
            drafter.extend(step.tokens)
        if self.constraint is not None:
            self.constraint.advance(step.tokens)
        stats.generated_tokens += len(step.tokens)
        return step
