"""Suffix decoding's index: matches in earlier answers, continuations chosen by count and by how they fared
when verified, drafts cut where the score drops."""

from __future__ import annotations

import pytest

from localspec.engine.drafters.suffix_index import DEFAULT_MAX_OCCURRENCES, MIN_MERGE_TOKENS, SuffixIndex


def make_index(*answers, **knobs) -> SuffixIndex:
    index = SuffixIndex(**knobs)
    for answer in answers:
        index.add(answer)
    return index


def test_an_empty_index_or_a_short_context_drafts_nothing():
    assert make_index().propose([1, 2, 3], 8).tokens == []
    assert make_index([1, 2, 3, 4]).propose([2, 3], 8).tokens == []  # shorter than a key


def test_continues_an_earlier_answer_up_to_its_end():
    draft = make_index([10, 11, 12, 13, 14, 15]).propose([99, 11, 12, 13], 8)
    assert draft.tokens == [14, 15]  # the answer ended there: no token of the next one
    assert draft.match_len == 3


def test_the_majority_continuation_wins_and_the_draft_stops_where_support_drops():
    common, rare = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9]
    index = make_index(common, common, rare, min_score=0.5)
    assert index.propose([1, 2, 3], 8).tokens == [4, 5, 6]
    # A three-way split leaves no continuation with half the support: the draft stops before it.
    split = make_index([1, 2, 3, 7], [1, 2, 3, 8], [1, 2, 3, 9], min_score=0.5)
    assert split.propose([1, 2, 3], 8).tokens == []


def test_the_runner_up_branch_is_where_the_draft_leaves_the_next_best_continuation():
    common, rare = [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 10]
    index = make_index(common, common, rare)
    draft = index.propose([1, 2, 3], 8)
    assert draft.tokens == [4, 5, 6]
    split, source = draft.runner_up
    assert split == 1 and index.tokens[source : source + 2].tolist() == [9, 10]
    assert make_index(common, common).propose([1, 2, 3], 8).runner_up is None  # nothing competes


def test_longer_matches_outvote_more_frequent_short_ones():
    """Copies follow their source: occurrences that match the context further back decide the branch."""
    index = make_index(*([[5, 1, 2, 3, 4]] * 5), [6, 7, 8, 9, 10, 11, 1, 2, 3, 40, 41])
    assert index.propose([6, 7, 8, 9, 10, 11, 1, 2, 3], 4).tokens == [40, 41]
    assert index.propose([0, 1, 2, 3], 4).tokens == [4]


def test_draft_length_is_capped():
    index = make_index(list(range(100)), max_draft=10)
    assert len(index.propose([0, 1, 2], 50).tokens) == 10
    assert len(index.propose([0, 1, 2], 4).tokens) == 4


def test_answers_added_after_a_merge_are_found_with_the_older_ones():
    filler = list(range(1000, 1000 + MIN_MERGE_TOKENS))
    # large enough to fold the recent table into the sorted one
    index = make_index([1, 2, 3, 4], [1, 2, 3, 4], filler, min_score=0.5)
    index.add([1, 2, 3, 9])
    index.add([7, 8, 9, 5])
    assert index.propose([1, 2, 3], 4).tokens == [4]  # two votes from the sorted table, one from the recent
    assert index.propose([7, 8, 9], 4).tokens == [5]
    assert len(index) == 2 * 5 + len(filler) + 1 + 2 * 5


def test_only_the_most_recent_occurrences_vote():
    index = make_index(*([[1, 2, 3, 4]] * DEFAULT_MAX_OCCURRENCES), *([[1, 2, 3, 5]] * DEFAULT_MAX_OCCURRENCES))
    assert index.propose([1, 2, 3], 4).tokens == [5]  # with the older ones too, a tie would draft 4


def test_a_continuation_rejected_again_and_again_is_cut_where_it_fails():
    index = make_index([10, 11, 1, 2, 3, 4, 5, 6, 7])
    assert index.propose([1, 2, 3], 8).sources == [5, 6, 7, 8]  # where in the history each token comes from
    for rejected in range(4):
        draft = index.propose([1, 2, 3], 8)
        # One rejection halves the score (every occurrence agrees on the token), the third cuts the draft.
        assert draft.tokens == ([4, 5, 6, 7] if rejected < 3 else [4]), rejected
        index.record(draft.sources, accepted=1)  # 4 accepted, 5 rejected, 6 and 7 never verified
    assert index.propose([1, 2, 3], 8).tokens == [4]  # what is no longer drafted keeps its outcomes
    assert index.propose([4, 5, 6], 8).tokens == [7]  # never rejected: it still drafts


def test_a_rejected_continuation_gives_way_to_the_competing_one():
    index = make_index([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9])
    draft = index.propose([1, 2, 3], 8)
    assert draft.tokens == [4, 5, 6]
    for _ in range(2):
        index.record(draft.sources, accepted=1)
    # Two occurrences against one, but the two were rejected twice: the one still scores its share, 1/3.
    assert index.propose([1, 2, 3], 8).tokens == [4, 9, 9]


def test_a_continuation_accepted_before_drafts_past_a_split_its_share_alone_would_stop():
    index = make_index([1, 2, 3, 4, 5, 6], min_score=0.5)
    draft = index.propose([1, 2, 3], 8)
    index.record(draft.sources, accepted=len(draft.tokens))
    index.add([1, 2, 3, 4, 7, 7])
    index.add([1, 2, 3, 4, 8, 8])
    assert index.propose([1, 2, 3], 8).tokens == [4, 5, 6]  # a third of the votes, but it was accepted
    assert make_index([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 7], [1, 2, 3, 4, 8, 8], min_score=0.5).propose(
        [1, 2, 3], 8
    ).tokens == [4]


def test_bad_knobs_are_refused():
    with pytest.raises(ValueError, match="min_score"):
        SuffixIndex(min_score=0.0)
    with pytest.raises(ValueError, match="prior_weight"):
        SuffixIndex(prior_weight=0.0)
