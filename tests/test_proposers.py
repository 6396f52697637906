"""The drafters: one interface (offer, then draft), one registry, and the decoder driving any of them."""

from __future__ import annotations

import numpy as np
import pytest
from rich.style import Style

from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.drafters.base import (
    COPY,
    FORCED,
    MODEL,
    TARGET,
    TARGET_ALONE,
    BaseDrafter,
    Draft,
    Offer,
    RoundState,
)
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.drafters.lookup import LookupDrafter
from localspec.engine.drafters.registry import DRAFTERS, METHODS, DrafterInputs, make_drafters, uses
from localspec.engine.drafters.suffix import SuffixDrafter
from localspec.engine.llama.model import Model
from localspec.engine.persist.history import HistoryStore
from localspec.engine.planner.controller import Controller

GREEDY = SamplingParams()


def state(context, limit=16):
    return RoundState(context, limit, GREEDY, np.random.default_rng(0))


def test_every_registered_drafter_says_once_what_it_is_and_the_method_table_follows():
    sources = [cls.source for cls in DRAFTERS]
    assert len(set(sources)) == len(sources) and not {TARGET, TARGET_ALONE} & set(sources)
    for cls in DRAFTERS:
        assert cls.kind in (FORCED, COPY, MODEL) and cls.prior and all(0 < a <= 1 for a in cls.prior.values())
        Style.parse(cls.style)  # the live view colours its tokens with it
        assert set(cls.methods) <= set(METHODS)
        # Whatever needs something to draft says why it cannot, so a method naming it fails up front.
        assert bool(cls.needs) == (cls.kind == MODEL)
    # Each method drafts with exactly the drafters that name it (a forced one in every method but none).
    assert METHODS[0] == TARGET_ALONE and METHODS[-1] == "auto"
    assert [s for s in sources if uses("hybrid", s)] == ["grammar", "lookup", "draft"]
    assert [s for s in sources if uses("mtp", s)] == ["grammar", "mtp"]
    assert not any(uses(TARGET_ALONE, s) for s in sources) and all(uses("auto", s) for s in sources)
    # The planner knows every registered drafter's kind without being told about any one of them.
    controller = Controller("auto")
    assert all(controller.allows(source) for source in sources)


def test_which_drafters_a_decoder_gets_depends_on_what_it_has(tiny_target, tiny_draft):
    target = Model(tiny_target, n_ctx=256, n_threads=1)
    bare = [d.source for d in make_drafters(DrafterInputs(target))]
    assert bare == ["grammar", "lookup"]
    draft = DraftModelDrafter(lambda: Model(tiny_draft, n_ctx=256, n_threads=1))
    full = make_drafters(DrafterInputs(target, draft, HistoryStore(None)))
    assert [d.source for d in full] == ["grammar", "lookup", "suffix", "draft"]
    assert not draft.loaded  # making drafters loads nothing: auto may never draft with the model


def test_lookup_offers_the_copy_with_its_evidence_and_drafts_a_prefix_of_it():
    drafter = LookupDrafter()
    context = [1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4]
    drafter.begin(context)
    offer = drafter.offer(state(context))
    assert (offer.source, list(offer.tokens), offer.match_len) == ("lookup", [5, 6, 9, 1, 2, 3, 4, 5, 6, 9, 1, 2, 3, 4, 5, 6], 4)
    assert drafter.draft(offer, 3, state(context)).tokens == [5, 6, 9]
    # A new generation on an edited context keeps only the common prefix's index.
    drafter.begin([1, 2, 3, 7])
    assert drafter.offer(state([1, 2, 3, 7])) is None
    drafter.extend([1, 2])
    assert drafter.offer(state([1, 2, 3, 7, 1, 2]), ).tokens[:2] == [3, 7]


def test_suffix_drafter_drafts_earlier_answers_and_learns_outcomes_in_memory_only(localspec_home):
    history = HistoryStore(localspec_home / "history.bin")
    drafter = SuffixDrafter(history)
    history.add([10, 11, 12, 13], [20, 21, 22, 23, 24, 25])  # as the decoder does after each answer
    assert not (localspec_home / "history.bin").exists()  # the session saves it
    context = [99, 12, 13, 20, 21, 22]
    offer = drafter.offer(state(context))
    assert list(offer.tokens[:3]) == [23, 24, 25] and offer.match_len >= 3
    draft = drafter.draft(offer, 3, state(context))
    before = history.index.propose(context, 16)
    drafter.judged(offer, draft, 0)  # its first token was rejected
    for _ in range(3):
        drafter.judged(offer, draft, 0)
    after = history.index.propose(context, 16)
    assert len(after.tokens) < len(before.tokens)  # a continuation rejected again and again is cut


def test_the_draft_models_offer_counts_its_catch_up_only_when_asked(tiny_target, tiny_draft):
    draft = DraftModelDrafter(lambda: Model(tiny_draft, n_ctx=256, n_threads=1), min_confidence=0.0)
    context = Model(tiny_target, vocab_only=True).tokenize("hello world the code", add_bos=True)
    offer = draft.offer(state(context, limit=4))
    assert offer.available == 4 and not draft.loaded
    made = draft.draft(offer, 3, state(context))
    assert made.source == "draft" and len(made.tokens) == 3 and made.steps == 3
    assert made.catch_up_tokens == len(context) - 1  # on first use, the whole context but its last token
    assert offer.catch_up() == 0  # the model's cache now holds the context: nothing to catch up on


class Oracle(BaseDrafter):
    """A drafter that knows the target's greedy answer: every draft it makes must be accepted."""

    source = "lookup"
    kind = COPY
    prior = {1: 0.99}

    def __init__(self, prompt, answer):
        self.known = [*prompt, *answer]
        self.offers = 0

    def offer(self, state):
        ahead = self.known[len(state.context) : len(state.context) + state.limit]
        self.offers += 1
        return Offer(self.source, len(ahead), match_len=64, tokens=ahead) if ahead else None

    def draft(self, offer, k, state):
        return Draft(list(offer.tokens[:k]), None, self.source)


@pytest.mark.parametrize("method", ["lookup", "auto"])
def test_the_decoder_drives_any_drafter_and_keeps_the_target_output(tiny_target, method):
    plain = SpeculativeDecoder(Model(tiny_target, n_ctx=256, n_threads=1), method="none")
    prompt = plain.target.tokenize("hello world the code", add_bos=True)
    expected = [t for step in plain.generate(prompt, max_tokens=40) for t in step.tokens]
    decoder = SpeculativeDecoder(Model(tiny_target, n_ctx=256, n_threads=1), method=method)
    oracle = Oracle(prompt, expected)
    decoder.drafters = [oracle]
    for _ in range(2):  # the first answer measures the one-token passes auto prices drafts against
        tokens = [t for step in decoder.generate(prompt, max_tokens=40) for t in step.tokens]
        assert tokens == expected
    stats = decoder.stats
    assert oracle.offers > 0 and stats.drafted > 0 and stats.accepted == stats.drafted
    assert stats.controller_note.startswith("drafted in")
