"""GenerationStats: the figures every viewer shows, and pooling them over several generations."""

from __future__ import annotations

from localspec.engine.decoding.stats import GenerationStats, Idle, judged


def _recorded(rounds: list[tuple[str, int, int]], tokens: int) -> GenerationStats:
    stats = GenerationStats(generated_tokens=tokens)
    for method, drafted, accepted in rounds:
        stats.record_round(method, drafted, accepted)
        stats.record_plan(method, 1.0 + drafted / 2, 0.1 + drafted / 100, accepted + 1, 0.1 + drafted / 90)
    return stats


def test_a_round_judges_drafts_up_to_the_first_rejection():
    assert [judged(4, a) for a in range(5)] == [1, 2, 3, 4, 4]
    assert judged(0, 0) == 0


def test_per_position_acceptance_counts_only_positions_reached():
    stats = _recorded([("lookup", 4, 1), ("lookup", 2, 2), ("draft", 3, 0)], tokens=8)
    assert stats.per_position_drafted == [3, 2]  # no draft reached positions 3 and 4
    assert stats.per_position_accepted == [2, 1]
    assert stats.per_position_acceptance == [2 / 3, 1 / 2]
    assert stats.acceptance_rate == 3 / 9 and stats.mean_accepted_length == 8 / 3


def test_pooled_figures_equal_those_of_one_generation_with_every_round():
    first = [("lookup", 4, 1), ("none", 0, 0)]
    second = [("lookup", 6, 6), ("draft", 2, 0), ("lookup", 1, 1)]
    pooled = GenerationStats.pooled([_recorded(first, 3), _recorded(second, 12)])
    together = _recorded(first + second, 15)
    for key in ("acceptance_rate", "mean_accepted_length", "per_position_acceptance", "per_position_drafted",
                "by_source", "drafted", "accepted", "target_passes", "generated_tokens", "planned"):
        assert pooled.to_dict()[key] == together.to_dict()[key], key


def test_every_answer_says_what_the_controller_did_also_when_it_drafted_nothing():
    idle = GenerationStats(generated_tokens=5)
    idle.record_round("none", 0, 0)  # the prefill's token: no reason to give
    for why in (Idle.MEASURING, Idle.PRICED_OUT, Idle.PRICED_OUT, Idle.NOTHING_OFFERED):
        idle.record_round("none", 0, 0, idle=why)
    assert idle.controller_note == f"no drafts: {Idle.PRICED_OUT}"  # the commonest reason
    assert idle.controller_note in idle.summary_line() and idle.to_dict()["controller_note"] == idle.controller_note
    busy = _recorded([("none", 0, 0), ("lookup", 4, 3), ("suffix", 2, 0), ("lookup", 3, 3)], tokens=10)
    busy.record_round("lookup", 2, 2, explored=True)
    assert busy.controller_note == "drafted in 4 of 5 rounds (lookup 3, suffix 1; 1 exploratory)"
    pooled = GenerationStats.pooled([idle, idle])
    assert pooled.idle == {Idle.MEASURING: 2, Idle.PRICED_OUT: 4, Idle.NOTHING_OFFERED: 2}


def test_an_answer_too_short_to_price_anything_says_so():
    stats = _recorded([("none", 0, 0)], tokens=1)
    assert stats.controller_note == f"no drafts: {Idle.MEASURING}"
