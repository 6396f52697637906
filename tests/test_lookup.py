"""PromptLookupProposer: exact drafts on hand-made histories, and equality with a naive rescan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.engine.lookup import (
    MAX_REPORTED_MATCH,
    RENAME_SEEN,
    SKIP_MATCH_LEN,
    SKIP_MIN_CONTEXT,
    PromptLookupProposer,
)


def naive_replacements(history: list[int], *, max_ngram: int, min_ngram: int) -> dict[int, tuple[int, int]]:
    """Replay the history: a token at q that took the place of the token following the latest earlier
    occurrence of the SKIP_MIN_CONTEXT tokens before it, with the next two tokens copied on as they were
    there, is learned as a replacement (old -> (new, times seen)); writing the old token again unlearns it."""
    learns = min_ngram <= SKIP_MIN_CONTEXT <= max_ngram
    replacements: dict[int, tuple[int, int]] = {}
    for p, token in enumerate(history):
        replacements.pop(token, None)
        q = p - 2
        if not learns or q < SKIP_MIN_CONTEXT:
            continue
        context = history[q - SKIP_MIN_CONTEXT : q]
        source = next((end for end in range(q - 1, SKIP_MIN_CONTEXT - 1, -1) if history[end - SKIP_MIN_CONTEXT : end] == context), None)
        if source is not None and history[source] != history[q]:
            if history[source + 1] == history[q + 1] and history[source + 2] == token:
                old, new = history[source], history[q]
                known, seen = replacements.get(old, (new, 0))
                replacements[old] = (new, seen + 1 if known == new else 1)
    return replacements


def naive_propose(
    history: list[int], max_tokens: int, *, max_ngram: int, min_ngram: int, max_draft: int
) -> tuple[list[int], int]:
    """The specification as a full rescan: longest suffix first (as written, then with renamed tokens
    turned back into the old ones), then its latest earlier occurrence; failing a match of
    SKIP_MIN_CONTEXT tokens, a longer match of the tokens before the last one, continued one token past
    the earlier occurrence (the last token edited that one). Learned replacements apply to the draft,
    which ends at one seen fewer than RENAME_SEEN times.

    Returns:
        The draft and the reported match length (0 for no match).
    """
    size = len(history)
    count = min(max_tokens, max_draft)
    if count <= 0:
        return [], 0
    learned = naive_replacements(history, max_ngram=max_ngram, min_ngram=min_ngram)
    renames = {old: new for old, (new, seen) in learned.items() if seen >= RENAME_SEEN}
    restore = {new: old for old, new in renames.items()}

    def copy_from(start: int) -> list[int]:
        # Overlapping copy: seq[start + k] where seq is history followed by the draft itself.
        seq = list(history)
        for k in range(count):
            seq.append(seq[start + k])
        draft = [learned[t][0] if t in learned else t for t in seq[size:]]
        cut = next((k + 1 for k, t in enumerate(seq[size:]) if t in learned and t not in renames), count)
        return draft[:cut]

    def same(earlier: int, later: int) -> bool:
        return earlier == later or renames.get(earlier) == later

    def latest_end(ngram: list[int]) -> int | None:
        # ``end`` is where the earlier occurrence stops; it must leave a token after it, so end < size.
        return next((end for end in range(size - 1, len(ngram) - 1, -1) if history[end - len(ngram) : end] == ngram), None)

    found = None
    for n in range(max_ngram, min_ngram - 1, -1):
        if n > size:
            continue
        suffix = history[size - n :]
        hit = latest_end(suffix)
        if hit is None and [restore.get(t, t) for t in suffix] != suffix:
            hit = latest_end([restore.get(t, t) for t in suffix])
        if hit is not None:
            if n == max_ngram:  # measured further back, a replaced token counting as its replacement
                while n < MAX_REPORTED_MATCH and n < hit and same(history[hit - 1 - n], history[size - 1 - n]):
                    n += 1
            found = (n, hit)
            break
    exact_len = found[0] if found else 0
    if exact_len < SKIP_MIN_CONTEXT:
        for m in range(max_ngram, max(exact_len, SKIP_MIN_CONTEXT - 1), -1):
            if m > size - 2:
                continue
            context = history[size - 1 - m : size - 1]
            # an earlier occurrence than the one ending just before the last token
            hit = next((end for end in range(size - 2, m - 1, -1) if history[end - m : end] == context), None)
            if hit is not None:
                return copy_from(hit + 1), SKIP_MATCH_LEN
    if found is None:
        return [], 0
    return copy_from(found[1]), found[0]


def make(history: list[int], **knobs) -> PromptLookupProposer:
    proposer = PromptLookupProposer(**knobs)
    proposer.extend(history)
    return proposer


def test_copies_what_followed_the_match():
    proposer = make([1, 2, 3, 4, 1, 2])
    assert proposer.propose(2) == [3, 4]
    assert proposer.last_match_len == 2


def test_longest_match_wins_over_a_more_recent_shorter_one():
    # (5, 1, 2) occurred once, followed by 9; (1, 2) occurred more recently, followed by 8.
    proposer = make([5, 1, 2, 9, 7, 1, 2, 8, 5, 1, 2])
    assert proposer.propose(1) == [9]
    assert proposer.last_match_len == 3


def test_most_recent_occurrence_wins():
    # (0, 1, 2) occurred twice before the suffix, followed by 3 and then by 4.
    proposer = make([0, 1, 2, 3, 0, 1, 2, 4, 0, 1, 2])
    assert proposer.propose(2) == [4, 0]
    assert proposer.last_match_len == 3


def test_no_match_gives_nothing():
    proposer = make([1, 2, 3])
    assert proposer.propose(8) == []
    assert proposer.last_match_len == 0
    assert PromptLookupProposer().propose(8) == []


def test_suffix_never_matches_itself():
    # The only occurrence of (7,) is the last token, and it has no continuation yet.
    proposer = make([1, 7], min_ngram=1)
    assert proposer.propose(4) == []


def test_min_ngram_rejects_short_matches():
    assert make([1, 2, 3, 1], min_ngram=2).propose(4) == []
    assert make([1, 2, 3, 1], min_ngram=1).propose(2) == [2, 3]


def test_repetition_is_drafted_as_a_period():
    # The latest earlier (1, 2) is 3 tokens back, so the draft repeats the period 3, 1, 2.
    proposer = make([9, 1, 2, 3, 1, 2])
    assert proposer.propose(7) == [3, 1, 2, 3, 1, 2, 3]
    assert make([5, 5, 5]).propose(4) == [5, 5, 5, 5]


def test_copying_a_file_back_drafts_a_long_run():
    rng = np.random.default_rng(0)
    file = rng.integers(0, 50_000, size=300).tolist()
    proposer = make([*file, 11, 12, *file[:4]])
    assert proposer.propose(48) == file[4:52]
    assert proposer.last_match_len == 4
    assert len(proposer.propose(1000)) == proposer.max_draft


def test_an_edited_token_resumes_the_copy_after_it():
    # source "... 1 2 3 4 50 6 7 8", output so far "1 2 3 4 60": 60 replaced 50, so copy from 6 on.
    proposer = make([9, 1, 2, 3, 4, 50, 6, 7, 8, 9, 1, 2, 3, 4, 60], max_ngram=8)
    assert proposer.propose(3) == [6, 7, 8]
    assert proposer.last_match_len == SKIP_MATCH_LEN


SOURCE = [1, 2, 3, 4, 50, 6, 7, 8, 9, 50, 10, 11, 12, 13, 50, 14, 15]


def test_a_replacement_seen_once_ends_the_draft():
    # the answer copied 1 2 3 4, wrote 60 for 50, then copied 6 7 on: a fix or a rename, so the draft
    # proposes 60 for the next 50 and stops there
    proposer = make([*SOURCE, 0, 1, 2, 3, 4, 60, 6, 7], max_ngram=8)
    assert proposer.propose(5) == [8, 9, 60]


def test_a_replacement_seen_twice_is_a_rename_drafted_throughout():
    proposer = make([*SOURCE, 0, 1, 2, 3, 4, 60, 6, 7, 8, 9, 60, 10, 11], max_ngram=8)
    assert proposer.propose(5) == [12, 13, 60, 14, 15]
    # the suffix matches with 60 read as 50, measured back to the start of the source
    assert proposer.last_match_len == 12


def test_writing_the_old_token_again_unlearns_a_replacement():
    proposer = make([*SOURCE, 0, 1, 2, 3, 4, 60, 6, 7, 8, 9, 50], max_ngram=8)
    assert proposer.propose(2) == [10, 11]
    proposer.truncate(len(SOURCE) + 8)  # back to "... 60 6 7": relearned from the history
    assert proposer.propose(3) == [8, 9, 60]


def test_a_token_that_was_inserted_is_not_learned_as_a_rename():
    # 60 was inserted before 50 (the copy goes on with 50, not with what followed it)
    source = [1, 2, 3, 4, 50, 6, 7, 8, 9, 50, 10]
    proposer = make([*source, 0, 1, 2, 3, 4, 60, 50, 6, 7, 8, 9], max_ngram=8)
    assert proposer.propose(2) == [50, 10]


def test_a_long_exact_match_beats_an_edit_skip():
    proposer = make([1, 2, 3, 4, 5, 6, 0, 2, 3, 4, 5, 1, 2, 3, 4, 5], max_ngram=8)
    assert proposer.propose(2) == [6, 0]
    assert proposer.last_match_len == 5


def test_extend_is_incremental():
    proposer = make([1, 2, 3])
    proposer.extend([1, 2])
    assert proposer.propose(1) == [3]
    proposer.extend(np.array([3, 1], dtype=np.int32))
    draft = proposer.propose(1)
    assert draft == [2] and type(draft[0]) is int
    assert len(proposer) == 7


def test_truncate_forgets_dropped_tokens():
    proposer = make([1, 2, 8, 4, 1, 2, 9, 4, 1, 2])
    assert proposer.propose(1) == [9]
    proposer.truncate(6)  # [1, 2, 8, 4, 1, 2]
    assert len(proposer) == 6
    assert proposer.propose(1) == [8]
    proposer.truncate(0)
    assert proposer.propose(1) == []
    with pytest.raises(ValueError):
        proposer.truncate(1)


def test_max_tokens_and_max_draft_cap_the_draft():
    proposer = make([1, 2, 3, 4, 5, 1], max_draft=2)
    assert proposer.propose(10) == [2, 3]
    assert proposer.propose(1) == [2]
    assert proposer.propose(0) == []


@pytest.mark.parametrize("knobs", [{"min_ngram": 0}, {"min_ngram": 3, "max_ngram": 2}, {"max_draft": 0}])
def test_rejects_bad_settings(knobs):
    with pytest.raises(ValueError):
        PromptLookupProposer(**knobs)


# A small alphabet makes matches of every length common; runs of extends, truncates and proposals
# check that the incremental index always answers what a full rescan of the history answers.
tokens = st.lists(st.integers(0, 3), max_size=12)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("extend"), tokens),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("propose"), st.integers(0, 10)),
    ),
    max_size=30,
)
knobs = st.tuples(st.integers(1, 4), st.integers(0, 3), st.integers(1, 12)).map(
    lambda t: {"min_ngram": t[0], "max_ngram": t[0] + t[1], "max_draft": t[2]}
)


@settings(max_examples=300, deadline=None)
@given(steps=steps, knobs=knobs)
def test_matches_a_naive_rescan(steps, knobs):
    proposer = PromptLookupProposer(**knobs)
    history: list[int] = []
    for op, arg in steps:
        if op == "extend":
            proposer.extend(arg)
            history += arg
        elif op == "truncate":
            history = history[: int(arg * len(history))]
            proposer.truncate(len(history))
            fresh = make(history, **knobs)
            assert fresh.propose(10) == proposer.propose(10)
            assert fresh.last_match_len == proposer.last_match_len
        assert len(proposer) == len(history)
        draft = proposer.propose(arg if op == "propose" else 10)
        expected = naive_propose(history, arg if op == "propose" else 10, **knobs)
        assert (draft, proposer.last_match_len) == expected
