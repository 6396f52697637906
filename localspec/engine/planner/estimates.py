"""Acceptance estimates per drafter, and the expected value of a draft.

With acceptance a_i for draft token i given the ones before it, drafting k tokens yields
1 + a_1 + a_1 a_2 + ... + a_1...a_k tokens for one target pass of k + 1 tokens (``expected_tokens``: the
one sum the planner and the benchmark's prediction both use). A copy drafter's estimate is kept per match
length (position i of a draft after an m-token match continues an m + i match), a model drafter's is
one number.

Long matches are judged rarely (a round has to copy that far), so their estimates would rest on the prior
long after the text has shown it copies worse, or better, than the prior assumed; a wrong long bet costs
a pass of many rows. So a match length's prior is lowered to follow the length below it: its chance of
failing is at least the shorter length's estimated chance times the ratio the priors give between the two
(never raised: the priors of long matches are near 1 already, and the loss is on the long side). And what
earlier answers taught weighs at most as much as the prior in a new answer: another text copies
differently, and its own rounds should soon outweigh the last one's.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence

from localspec.engine.decoding.stats import judged

# How many rounds' worth of belief a prior carries.
PRIOR_WEIGHT = 3.0
# Copy observations fade each round, so an estimate follows the text and an option written off long ago
# drifts back toward its prior and gets tried again (a copy probe costs one short pass). A model
# drafter's estimate fades only as it is used: trying it again costs a catch-up.
FORGET = 0.98
# The upper bound planning may hope for: the rate plus this many standard deviations.
HOPEFUL_SIGMAS = 2.0


def expected_tokens(rates: Sequence[float]) -> list[float]:
    """Expected tokens one round yields for each draft length 0..len(rates); ``rates[i]``: P(draft token
    i accepted | those before it were). The target's own token always comes."""
    return [1.0, *running_expected_tokens(rates)]


def running_expected_tokens(rates: Iterable[float]) -> Iterator[float]:
    """``expected_tokens`` for draft lengths 1, 2, ... as they are summed (planning prices 64 every round)."""
    total = reach = 1.0
    for rate in rates:
        reach *= rate
        total += reach
        yield total


class Acceptance:
    """Beta-style estimate of P(a drafted token is accepted | the ones before it were)."""

    def __init__(self, prior: float) -> None:
        self.prior = prior
        self.accepted = 0.0
        self.judged = 0.0

    @property
    def rate(self) -> float:
        return self.rate_from(self.prior)

    @property
    def hopeful(self) -> float:
        """The rate plus HOPEFUL_SIGMAS standard deviations: what it might still turn out to be."""
        return self.bound_from(self.prior, HOPEFUL_SIGMAS)

    def rate_from(self, prior: float) -> float:
        """The estimate, starting from ``prior`` rather than its own."""
        return (prior * PRIOR_WEIGHT + self.accepted) / (PRIOR_WEIGHT + self.judged)

    def bound_from(self, prior: float, sigmas: float) -> float:
        """The rate, starting from ``prior``, plus ``sigmas`` standard deviations of the estimate (minus,
        where negative), within 0..1."""
        rate = self.rate_from(prior)
        bound = rate + sigmas * math.sqrt(rate * (1.0 - rate) / (PRIOR_WEIGHT + self.judged))
        return min(1.0, max(0.0, bound))

    def record(self, drafted: int, accepted: int) -> None:
        self.accepted += accepted
        self.judged += judged(drafted, accepted)

    def forget(self) -> None:
        self.accepted *= FORGET
        self.judged *= FORGET

    def carry_over(self) -> None:
        """A new answer starts: keep the estimate, weighed at most as the prior."""
        if self.judged > PRIOR_WEIGHT:
            scale = PRIOR_WEIGHT / self.judged
            self.accepted *= scale
            self.judged = PRIOR_WEIGHT


class MatchAcceptance:
    """Acceptance per match length, bucketed as the prior's keys (4 stands for 4-7 if 8 is the next)."""

    def __init__(self, prior: Mapping[int, float]) -> None:
        self.buckets = {length: Acceptance(a) for length, a in prior.items()}
        self._lengths = sorted(self.buckets)  # planning looks one up per draft position, so by bisection

    def _bucket(self, match_len: int) -> int:
        return bisect.bisect_right(self._lengths, max(1, match_len)) - 1

    def at(self, match_len: int) -> Acceptance:
        return self.buckets[self._lengths[self._bucket(match_len)]]

    def _estimates(self, sigmas: float = 0.0) -> list[float]:
        """Each bucket's rate (plus ``sigmas`` standard deviations), shortest first, its prior following the
        bucket below."""
        estimates, below = [], None
        for length in self._lengths:
            bucket = self.buckets[length]
            prior = bucket.prior
            if below is not None:
                shorter, shorter_rate = below
                prior = min(prior, 1.0 - (1.0 - shorter_rate) * (1.0 - prior) / (1.0 - shorter.prior))
            rate = bucket.rate_from(prior)
            estimates.append(bucket.bound_from(prior, sigmas) if sigmas else rate)
            below = (bucket, rate)
        return estimates

    def rate(self, match_len: int) -> float:
        return self._estimates()[self._bucket(match_len)]

    def rates(self, match_len: int, k_max: int, *, sigmas: float = 0.0) -> list[float]:
        """Acceptance per draft position: position i continues a match of ``match_len + i`` tokens, so a
        copy in progress is expected to run on longer the further it has already run. ``sigmas``: each
        estimate plus that many of its standard deviations (hopeful, or where negative cautious)."""
        lengths, rates = self._lengths, []
        estimates = self._estimates(sigmas)
        # Bucket by bucket: planning asks for up to 64 positions every round.
        i = self._bucket(match_len)
        while len(rates) < k_max:
            upto = lengths[i + 1] - match_len if i + 1 < len(lengths) else k_max
            rates += [estimates[i]] * (min(upto, k_max) - len(rates))
            i += 1
        return rates

    def record(self, match_len: int, drafted: int, accepted: int) -> None:
        """Draft position i continues a match of match_len + i tokens if the ones before it held."""
        for i in range(judged(drafted, accepted)):
            self.at(match_len + i).record(1, int(i < accepted))

    def forget(self) -> None:
        for estimate in self.buckets.values():
            estimate.forget()

    def carry_over(self) -> None:
        for estimate in self.buckets.values():
            estimate.carry_over()

    def summary(self) -> dict[int, float]:
        return {length: round(rate, 3) for length, rate in zip(self._lengths, self._estimates())}
