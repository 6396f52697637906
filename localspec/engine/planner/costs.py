"""What speculating costs on this machine, as measured: target passes per batch size, a model drafter's
steps and catch-up, a recurrent target's checkpoints and restores (``Costs``: the target's, which decoders
on the same target may share), and a decoder's own Python work per round (``RoundOverheads``).

Pass costs are kept relative to a one-token pass of their time, so a spell when another process slows
the machine leaves no stale absolute cost for sizes that are then no longer in use. Every measured cost
is the median of its last few measurements (``RecentMedian``).

Until a head's step is measured, its cost is a prior from the shapes or parameters of the models
(``mtp_head_cost_ratio``, ``companion_head_cost_ratio``).
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from localspec.engine.llama.kernels import MAX_VERIFY_BATCH

# Until a batch size is measured, assume each extra token adds this share of a one-token pass. A 2-core
# CPU pays about a third of a pass per extra token in small batches; erring high keeps the first rounds
# of an answer from probing at a loss, and a size in use is measured after one round.
PRIOR_BATCH_SLOPE = 0.35
MIN_SLOPE_BATCH = 4
# A draft model's step before it is measured, relative to a target step, when nothing better is known
# (open_decoder passes the ratio of the model files' sizes).
DEFAULT_DRAFT_COST_RATIO = 0.5
# Measurements a cost is the median of.
COST_WINDOW = 7
# A batch size with fewer samples than this is not yet trusted.
TRUSTED_SAMPLES = 3
# One-token passes right after a larger one are slower, the first most: llama.cpp builds its graph for one
# token again, and the machine takes a while to come back from the heavier pass (a pass on another context
# shows it too). On the 2-core Intel Xeon after a 3-token pass of SmolLM2-135M: +9%, +4%, +3%, then 1-2% for
# several passes, 0.3-0.6 of a pass in all. The excess of this many one-token passes after a larger one
# over a one-token pass is what leaving one-token passes costs (``return_s``).
RETURN_PASSES = 8


def output_share(n_vocab: int, n_embd: int, n_params: int) -> float:
    """The output projection's share of one token's work, from the shapes: its weights against the
    blocks' (embeddings and projection aside, tied or not)."""
    output = n_vocab * n_embd
    return output / (max(n_params - 2 * output, 0) + output)


def mtp_head_cost_ratio(*, n_vocab: int, n_embd: int, n_params: int, n_layers: int) -> float:
    """An MTP head's step against a one-token target pass, from the target's shapes: one block of the
    trunk's and the output projection, which on a small model with a large vocabulary is most of a pass.

    The head's weights lie inside the target's file, counted in ``n_params``, so its size is known only
    from the shapes; a companion head's file counts its own (``companion_head_cost_ratio``).
    """
    share = output_share(n_vocab, n_embd, n_params)
    return share + (1.0 - share) / max(n_layers, 1)


def companion_head_cost_ratio(head_params: int, *, n_vocab: int, n_embd: int, n_params: int) -> float:
    """A companion head's (EAGLE-3's step, DFlash's one-row pass) against a one-token target pass, by
    parameters: the head file's own, and an output projection counted at the target's size (it lends the
    target's, or carries a smaller one of its own), against the target's ``n_params``."""
    output = n_vocab * n_embd
    return min(1.0, (head_params + output) / max(n_params, 1))


class RecentMedian:
    """A measured cost, as the median of its last ``COST_WINDOW`` measurements: one slow one (a pass
    another process slowed, a round that met a garbage collection) barely moves it and soon rolls out,
    where a running mean would carry it into the prices of many rounds."""

    def __init__(self) -> None:
        self.samples: deque[float] = deque(maxlen=COST_WINDOW)

    def __len__(self) -> int:
        return len(self.samples)

    def add(self, sample: float) -> float:
        """Keep ``sample`` (the oldest rolls out once ``COST_WINDOW`` are kept); the median after it."""
        self.samples.append(sample)
        return statistics.median(self.samples)


class ModelDrafterCosts:
    """A model drafter's step and catch-up costs, from a prior ratio to the target until measured.

    Args:
        cost_ratio: prior for (draft step time / one-token target pass), e.g. the ratio of the model
            file sizes; also scales the prior for the catch-up.
        load_s: seconds loading the model will take, charged to its first use.
    """

    def __init__(self, cost_ratio: float = DEFAULT_DRAFT_COST_RATIO, load_s: float = 0.0) -> None:
        self.cost_ratio = cost_ratio
        self.load_s = load_s
        self.step_s: float | None = None
        self.catch_up_per_token: float | None = None
        self._steps, self._catch_ups = RecentMedian(), RecentMedian()

    def record(self, catch_up_tokens: int, catch_up_s: float, steps: int, steps_s: float) -> None:
        """One draft: a catch-up batch (0 tokens when it was in step), then its steps."""
        self.load_s = 0.0  # loaded now
        if catch_up_tokens:
            self.catch_up_per_token = self._catch_ups.add(catch_up_s / catch_up_tokens)
        if steps:
            self.step_s = self._steps.add(steps_s / steps)


class Costs:
    """Measured costs, and estimates for what is not measured yet."""

    def __init__(self) -> None:
        self._pass_samples: dict[int, RecentMedian] = {}
        # Sizes whose oldest sample is a cost remembered from earlier sessions (until it rolls out).
        self._remembered: set[int] = set()
        self.one: float | None = None  # a one-token pass in seconds
        self._relative: dict[int, float] = {}  # larger passes relative to a one-token pass
        self._sizes: list[int] = []  # the measured batch sizes, sorted
        self._unscaled: list[tuple[int, float]] = []  # passes measured before any one-token pass
        # Pass costs relative to a one-token pass by size from 0 up, as priced and as far as asked
        # (relative_curve): they change only when a larger pass is measured.
        self._curve: list[float] = [0.0]
        self.curve_version = 0  # counts the times it was priced afresh
        # A large prefill, as a verification of its size would cost: where long drafts are not measured yet,
        # what they may cost (a hint, never remembered as a measurement).
        self._anchor: tuple[int, float] | None = None
        self._checkpoints, self._restores = RecentMedian(), RecentMedian()
        self.checkpoint_s: float | None = None  # saving a recurrent state; free until first measured
        self.restore_s: float | None = None  # restoring one, beyond the replay pass itself
        # The one-token passes since the last larger one while they are fewer than RETURN_PASSES (else None),
        # their excess so far, and the one-token pass before the larger one that it is taken against.
        self._returning: int | None = None
        self._return_excess = self._return_base = 0.0
        self._returns = RecentMedian()
        self.return_s = 0.0  # what leaving one-token passes costs (RETURN_PASSES); free until measured
        self._held: list[tuple[int, float]] | None = None  # passes timed inside ``held``, not yet recorded

    # -- target passes ---------------------------------------------------------------------------
    @contextmanager
    def held(self) -> Iterator[None]:
        """Passes timed inside are recorded when it ends. Decoders sharing these costs that take a round each
        in turn (bench's lockstep) then price their rounds of one turn with the same figures: otherwise the
        later ones would price theirs with the passes the earlier ones had just timed, and part from them at
        near-ties by the order alone."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            for batch_size, seconds in held:
                self.record_pass(batch_size, seconds)

    def record_pass(self, batch_size: int, seconds: float) -> None:
        """A target pass of ``batch_size`` tokens, in the order the machine ran them. The RETURN_PASSES
        one-token passes after a larger one also measure ``return_s``. They stay one-token samples, or a
        session that drafts in most rounds would seldom time one; for a few rounds after a larger pass they
        make a one-token pass look dearer, and so every pass alike, the priced choices among them barely."""
        if self._held is not None:
            self._held.append((batch_size, seconds))
            return
        if batch_size == 1 and self._returning is not None:
            # Against the one-token pass before the larger one: the slower passes move the median as they come.
            self._return_excess += seconds - self._return_base
            self._returning += 1
            if self._returning == RETURN_PASSES:
                self.return_s = max(0.0, self._returns.add(self._return_excess))
                self._returning = None
        if batch_size != 1:
            if self.one is None:
                self._unscaled.append((batch_size, seconds))
                return
            # A return cut short by another larger pass is not what leaving one-token passes costs: it
            # starts again.
            self._returning, self._return_excess, self._return_base = 0, 0.0, self.one
            self._add_sample(batch_size, seconds / self.one)
            return
        self.one = self._add_sample(1, seconds)
        self._relative[1] = 1.0
        for batch, unscaled in self._unscaled:
            self._add_sample(batch, unscaled / self.one)
        self._unscaled.clear()

    def prompt_evaluated(self) -> None:
        """A prompt was evaluated: the one-token passes after it follow the prefill, not a larger verification,
        so a return in progress is dropped."""
        self._returning = None

    def record_prefill(self, batch_size: int, seconds: float, output_share: float) -> None:
        """A prompt pass of ``batch_size`` tokens, kept as a hint of what long drafts cost. It computed one
        row of logits where a verification computes one per token, and took the exact kernels' prefill
        paths: priced as a verification, its rows' share of output projection is added back, and it stays
        a hint: so priced, a prefill still comes to less than a verification of its size."""
        rows = batch_size * (1.0 - output_share) + output_share
        self._anchor = (batch_size, seconds * batch_size / rows)
        self._reprice()

    def _reprice(self) -> None:
        del self._curve[1:]
        self.curve_version += 1

    def one_token_samples(self) -> int:
        return len(self._pass_samples.get(1, ()))

    def _add_sample(self, batch_size: int, value: float) -> float:
        if batch_size != 1:
            self._reprice()
        samples = self._pass_samples.get(batch_size)
        if samples is None:  # (not setdefault: every pass of every round comes here)
            samples = self._pass_samples[batch_size] = RecentMedian()
        if len(samples) == COST_WINDOW:
            self._remembered.discard(batch_size)  # a remembered cost is the first sample in: it rolls out first
        if batch_size not in self._relative:
            self._sizes = sorted((*self._relative, batch_size))
        median = self._relative[batch_size] = samples.add(value)
        return median

    def remember(self, relative: Mapping[int, float]) -> None:
        """Seed pass costs (relative to a one-token pass) measured in earlier sessions on this machine.

        Each is trusted at once but counts as one sample, so this session's passes of its size outvote it
        from the second. A cost that prices a size as a loss keeps auto from drafting at that size, and so
        from measuring it again: one above the cost of a larger size (a pass does no less work than a smaller
        one) is stale, taken while another process slowed the machine (on the 2-core Intel Xeon a 2-token
        pass was remembered at 3.0 one-token passes, above a 4-token pass's 1.51; it costs 1.05), and is left
        out, to be estimated and measured.
        """
        relative = {b: v for b, v in relative.items() if 1 < b <= MAX_VERIFY_BATCH}
        for batch_size, value in relative.items():
            if any(other < value for larger, other in relative.items() if larger > batch_size):
                continue
            if batch_size not in self._relative:
                self._remembered.add(batch_size)
                self._add_sample(batch_size, value)

    def _trusted(self, batch_size: int) -> bool:
        return batch_size in self._remembered or len(self._pass_samples[batch_size]) >= TRUSTED_SAMPLES

    def relative_costs(self) -> dict[int, float]:
        """Trusted verification pass costs relative to a one-token pass, remembered ones included."""
        return {
            batch_size: value
            for batch_size, value in self._relative.items()
            if 1 < batch_size <= MAX_VERIFY_BATCH and self._trusted(batch_size)
        }

    def measured_costs(self) -> dict[int, float]:
        """The verification pass costs this session measured itself, each from enough of its own passes,
        for the next sessions: a remembered cost it never re-measured is not written back as if it had."""
        costs = {}
        for batch_size in self.relative_costs():
            own = len(self._pass_samples[batch_size]) - (batch_size in self._remembered)
            if own >= TRUSTED_SAMPLES:
                costs[batch_size] = statistics.median(list(self._pass_samples[batch_size].samples)[-own:])
        return costs

    def measured_passes(self) -> dict[int, float]:
        """Seconds per measured batch size (none before a one-token pass gives them a scale)."""
        return {} if self.one is None else {b: self._measured(b) for b in self._sizes}

    def _measured(self, batch_size: int) -> float:
        return self.one * self._relative[batch_size]

    def pass_cost(self, batch_size: int) -> float | None:
        """Measured seconds for a target pass, or an estimate for an unmeasured size.

        From the measured size below, the cost grows at the slope measured up to it (the prior slope
        before there is one); that slope is trusted up to twice the size, and beyond, toward the next
        measured size (past the largest, the prefill hint of ``record_prefill``), the cost follows a
        straight line to it (a large pass is cheaper per token: kernels switch, fixed costs spread).
        Erring high near measured sizes keeps short drafts from probing at a loss; erring low far from
        them lets long drafts be tried, and a size in use is measured after one round.
        """
        one = self.one
        if one is None:
            return None
        curve = self._curve
        if batch_size < len(curve):
            return one * curve[batch_size]
        if batch_size <= MAX_VERIFY_BATCH:
            return one * self.relative_curve(batch_size)[batch_size]
        return one * self._price_sizes(batch_size, batch_size)[0]

    def relative_curve(self, largest: int) -> list[float]:
        """Pass costs relative to a one-token pass for batch sizes 0..``largest`` (index = size; 0 unused),
        as ``pass_cost`` prices them (``largest`` at most MAX_VERIFY_BATCH). Kept until a pass of more than
        one token is measured: planning reads the curve every round."""
        curve = self._curve
        if len(curve) <= largest:
            curve += self._price_sizes(len(curve), largest)
        return curve

    def _price_sizes(self, first: int, last: int) -> list[float]:
        """Passes of ``first``..``last`` tokens relative to a one-token pass, as ``pass_cost`` says: a
        trusted measurement, else the estimate (below a size measured once or twice, which may have been
        slowed by another process: a guess from the other sizes keeps it in use until more samples settle
        it). Sizes are walked in order, so each stretch between measured sizes is set up once."""
        sizes, relative, anchor = self._sizes, self._relative, self._anchor
        prices = []
        i = bisect.bisect_left(sizes, first)
        stretch = None
        for batch_size in range(first, last + 1):
            while i < len(sizes) and sizes[i] < batch_size:
                i += 1
            measured = relative.get(batch_size)
            if measured is not None and (batch_size == 1 or self._trusted(batch_size)):
                prices.append(measured)
                continue
            # The measured sizes either side (itself left out where measured but not trusted).
            below = sizes[i - 1]
            j = i + 1 if i < len(sizes) and sizes[i] == batch_size else i
            above = sizes[j] if j < len(sizes) else None
            if above is None and anchor is not None and anchor[0] >= batch_size:
                above = anchor[0]
            if stretch != (below, above):  # a new stretch between measured sizes
                stretch = (below, above)
                low = relative[below]
                # The step from one token to two is the steepest on a CPU, so it alone does not set the slope.
                slope = PRIOR_BATCH_SLOPE if below < MIN_SLOPE_BATCH else (low - 1.0) / (below - 1)
                if above is not None:
                    high = relative[above] if j < len(sizes) else anchor[1] / self.one
                    reach = min(above, 2 * max(below, MIN_SLOPE_BATCH))
            if above is None:
                estimate = low + slope * (batch_size - below)
            else:
                estimate = min(low + slope * (min(batch_size, reach) - below), high)
                if batch_size > reach:
                    estimate += (batch_size - reach) / (above - reach) * (high - estimate)
                # Where the measured sizes show costs rising faster than that, the straight line between them.
                estimate = max(estimate, low + (batch_size - below) / (above - below) * (high - low))
            prices.append(estimate if measured is None else min(measured, estimate))
        return prices

    # -- a recurrent target's state -------------------------------------------------------------
    def record_checkpoint(self, seconds: float) -> None:
        self.checkpoint_s = self._checkpoints.add(seconds)

    def record_restore(self, seconds: float, replayed: int) -> None:
        """A restored checkpoint and the ``replayed`` tokens evaluated again on it; the replay itself is
        priced as a pass of that size, so only the rest is kept."""
        replay = self.pass_cost(replayed) or 0.0
        self.restore_s = self._restores.add(max(0.0, seconds - replay))

    # -- model drafters --------------------------------------------------------------------------
    def step_cost(self, model: ModelDrafterCosts) -> float | None:
        """Seconds of one draft step: a token of a chained drafter; of a block drafter, a one-row pass (the
        planner scales it to a block's rows as the target's passes scale)."""
        if model.step_s is not None:
            return model.step_s
        return None if self.one is None else self.one * model.cost_ratio

    def catch_up_cost(self, model: ModelDrafterCosts, tokens: int) -> float:
        """Seconds a model drafter spends on a catch-up batch of ``tokens`` before its steps.

        Until one is measured: the target's per-token cost in its largest measured pass (a prefill,
        usually) scaled by the drafter's cost ratio.
        """
        per_token = model.catch_up_per_token
        if per_token is None:
            largest = self._sizes[-1] if self._sizes and self.one is not None else None
            per_token = 0.0 if largest is None else self._measured(largest) / largest * model.cost_ratio
        return tokens * per_token


class RoundOverheads:
    """A decoder's own work per round beside its passes and drafting (offering, pricing, accepting, rolling
    back), kept apart for rounds that drafted: verifying k + 1 rows' logits and rolling back cost more than
    a target-alone round's (0.44 against 0.13-0.27 ms on the 2-core Intel Xeon), and one blended figure
    would price drafting below what it costs beside the target alone. It is the decoder's, not the target's:
    each method's Python differs."""

    def __init__(self) -> None:
        self._samples = {False: RecentMedian(), True: RecentMedian()}
        self.alone = 0.0  # a round kept to the target alone
        self.drafting: float | None = None  # a round that drafted; until measured, as the above

    def record(self, seconds: float, *, drafted: bool) -> None:
        """One round's own work: a round priced dear would make drafting, whose tokens share it, look cheap
        per token."""
        median = self._samples[drafted].add(seconds)
        if drafted:
            self.drafting = median
        else:
            self.alone = median

    def of(self, drafted: bool) -> float:
        """The own work of a round that drafts, or of one kept to the target alone."""
        return self.drafting if drafted and self.drafting is not None else self.alone
