"""PromptLookupIndex: exact drafts on hand-made histories, and equality with a naive rescan."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localspec.engine.drafters.lookup_index import (
    FOLLOW_MIN_MATCH,
    MAX_REPORTED_MATCH,
    RENAME_SEEN,
    REPLACEMENT_CONTEXT,
    RESUME_WINDOW,
    RESUMED_MATCH_LEN,
    PromptLookupIndex,
)


def naive_replacements(history: list[int], *, max_ngram: int, min_ngram: int) -> dict[int, tuple[int, int]]:
    """Replay the history: a token at q that took the place of the token following the latest earlier
    occurrence of the REPLACEMENT_CONTEXT tokens before it, with the next two tokens copied on as they were
    there, is learned as a replacement (old -> (new, times seen)); writing the old token again unlearns it."""
    replacements: dict[int, tuple[int, int]] = {}
    for replacements in naive_replacements_so_far(history, max_ngram=max_ngram, min_ngram=min_ngram):
        pass
    return replacements


def naive_replacements_so_far(history: list[int], *, max_ngram: int, min_ngram: int):
    """Yields the replacements learned up to each token of the history, that token included (one dict,
    updated in place)."""
    learns = min_ngram <= REPLACEMENT_CONTEXT <= max_ngram
    replacements: dict[int, tuple[int, int]] = {}
    for p, token in enumerate(history):
        replacements.pop(token, None)
        q = p - 2
        if not learns or q < REPLACEMENT_CONTEXT:
            yield replacements
            continue
        context = history[q - REPLACEMENT_CONTEXT : q]
        source = next((end for end in range(q - 1, REPLACEMENT_CONTEXT - 1, -1) if history[end - REPLACEMENT_CONTEXT : end] == context), None)
        if source is not None and history[source] != history[q]:
            if history[source + 1] == history[q + 1] and history[source + 2] == token:
                old, new = history[source], history[q]
                known, seen = replacements.get(old, (new, 0))
                replacements[old] = (new, seen + 1 if known == new else 1)
        yield replacements


def naive_copy_source(history: list[int], *, max_ngram: int, min_ngram: int) -> tuple[int | None, int]:
    """Replay where a copy in progress reads from. It moves on while each token equals its source's (or
    that token's learned replacement) and breaks at an edit. After one, it resumes within RESUME_WINDOW
    source tokens where a token meets the source again: where the edit's length puts it (replaced, then
    inserted; its copied length halves), elsewhere only with the token before it matching too (copied
    length 2). At a
    break, or while no copy is in progress, a copy starts after the latest earlier occurrence of the
    longest suffix (FOLLOW_MIN_MATCH to max_ngram tokens) ending with the token, copied length that suffix's.

    Returns:
        (the position the next token would be copied from, tokens copied), or (None, 0).
    """
    source = broken_at = None
    copied = since = 0
    learned = naive_replacements_so_far(history, max_ngram=max_ngram, min_ngram=min_ngram)
    for p, (token, replacements) in enumerate(zip(history, learned)):
        if source is not None:
            if token in (history[source], replacements.get(history[source], (None,))[0]):
                source, copied = source + 1, copied + 1
                continue
            broken_at, since, source = source, 0, None
        elif broken_at is not None:
            since += 1
            halved = max(RESUMED_MATCH_LEN, copied // 2)
            meets = [(j, halved) for j in (broken_at + since, broken_at) if j < p and history[j] == token]
            meets += [
                (j, 2)
                for j in range(max(1, broken_at), min(broken_at + RESUME_WINDOW, p))
                if history[j] == token and history[j - 1] == history[p - 1]
            ]
            if meets:
                (j, copied), broken_at = meets[0], None
                source = j + 1
                continue
            if since >= RESUME_WINDOW:
                broken_at = None
        for n in range(min(max_ngram, p + 1), max(min_ngram, FOLLOW_MIN_MATCH) - 1, -1):
            suffix = history[p - n + 1 : p + 1]
            end = next((e for e in range(p, n - 1, -1) if history[e - n : e] == suffix), None)
            if end is not None:
                source, broken_at, copied = end, None, n
                break
    return source, copied


def naive_propose(
    history: list[int], max_tokens: int, *, max_ngram: int, min_ngram: int, max_draft: int
) -> tuple[list[int], int]:
    """The specification as a full rescan: a copy in progress (``naive_copy_source``, drafted with renames
    only) unless a longer match than it has copied was found; else the longest suffix first (as written,
    then with renamed tokens turned back into the old ones), then its latest earlier occurrence. Learned
    replacements apply to the draft, which ends at one seen fewer than RENAME_SEEN times.

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

    def copy_from(start: int, replacing: dict[int, tuple[int, int]]) -> list[int]:
        # Overlapping copy: seq[start + k] where seq is history followed by the draft itself.
        seq = list(history)
        for k in range(count):
            seq.append(seq[start + k])
        draft = [replacing[t][0] if t in replacing else t for t in seq[size:]]
        cut = next((k + 1 for k, t in enumerate(seq[size:]) if t in replacing and t not in renames), count)
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
    source, copied = naive_copy_source(history, max_ngram=max_ngram, min_ngram=min_ngram)
    if source is not None and exact_len <= copied:  # only a longer match pulls a copy off its source
        return copy_from(source, {old: learned[old] for old in renames}), min(copied, MAX_REPORTED_MATCH)
    if found is None:
        return [], 0
    return copy_from(found[1], learned), found[0]


def make(history: list[int], **knobs) -> PromptLookupIndex:
    proposer = PromptLookupIndex(**knobs)
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
    # a copy of 0 1 2 with 3 replaced by 4, followed since: three tokens, then half of those and two more
    assert proposer.last_match_len == 5


def test_no_match_gives_nothing():
    proposer = make([1, 2, 3])
    assert proposer.propose(8) == []
    assert proposer.last_match_len == 0
    assert PromptLookupIndex().propose(8) == []


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


def test_an_edited_token_pauses_the_copy_until_the_answer_meets_its_source_again():
    # source "... 1 2 3 4 50 6 7 8 9 10", output so far "1 2 3 4 60": which source token 60 stands for is
    # a guess, so nothing is drafted; once the answer writes 6, the copy resumes after it.
    proposer = make([9, 1, 2, 3, 4, 50, 6, 7, 8, 9, 10, 0, 1, 2, 3, 4, 60], max_ngram=8)
    assert proposer.propose(3) == []
    proposer.extend([6])
    assert proposer.propose(3) == [7, 8, 9]
    assert proposer.last_match_len == RESUMED_MATCH_LEN


SOURCE = [1, 2, 3, 4, 50, 6, 7, 8, 9, 50, 10, 11, 12, 13, 50, 14, 15]
NEW_TEXT = list(range(100, 100 + RESUME_WINDOW + 4))  # long enough for a broken copy to be dropped


def test_a_replacement_seen_once_ends_the_draft():
    # the answer wrote 60 for 50 after 1 2 3 4, then copied 6 7 on: a fix or a rename, so a draft that is
    # not a copy in progress (new text, then a short match) proposes 60 for the next 50 and stops there
    proposer = make([*SOURCE, 0, 1, 2, 3, 4, 60, 6, 7, *NEW_TEXT, 8, 9], max_ngram=8)
    assert proposer.propose(5) == [60]


def test_a_copy_in_progress_drafts_its_source_through_a_replacement_seen_once():
    # the answer copies SOURCE: one 60 for 50 may be a one-off fix, and the source says 50
    proposer = make([*SOURCE, 0, 1, 2, 3, 4, 60, 6, 7], max_ngram=8)
    assert proposer.propose(5) == [8, 9, 50, 10, 11]


def test_a_replacement_seen_twice_is_a_rename_drafted_throughout():
    proposer = make([*SOURCE, 0, 1, 2, 3, 4, 60, 6, 7, 8, 9, 60, 10, 11], max_ngram=8)
    assert proposer.propose(5) == [12, 13, 60, 14, 15]
    # the suffix matches with 60 read as 50, measured back to the start of the source
    assert proposer.last_match_len == 12


def test_writing_the_old_token_again_unlearns_a_replacement():
    proposer = make([*SOURCE, 0, 1, 2, 3, 4, 60, 6, 7, 8, 9, 50], max_ngram=8)
    assert proposer.propose(2) == [10, 11]
    proposer.truncate(len(SOURCE) + 8)  # back to "... 60 6 7": relearned from the history
    proposer.extend([*NEW_TEXT, 8, 9])
    assert proposer.propose(3) == [60]


def test_a_token_that_was_inserted_is_not_learned_as_a_rename():
    # 60 was inserted before 50 (the copy goes on with 50, not with what followed it)
    source = [1, 2, 3, 4, 50, 6, 7, 8, 9, 50, 10]
    proposer = make([*source, 0, 1, 2, 3, 4, 60, 50, 6, 7, 8, 9], max_ngram=8)
    assert proposer.propose(2) == [50, 10]


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
        PromptLookupIndex(**knobs)


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
    proposer = PromptLookupIndex(**knobs)
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


def replay(prompt: list[int], answer: list[int], k: int = 16) -> tuple[int, int, list[list[int]]]:
    """Generate ``answer`` after ``prompt`` as the decoder would with greedy verification: each round
    drafts up to k tokens, keeps the prefix that matches the answer, then the answer's next token.

    Returns:
        drafted, accepted, and the rejected part of every draft that had one.
    """
    proposer = make(prompt, max_ngram=8)
    drafted = accepted = 0
    rejected = []
    done = 0
    while done < len(answer):
        draft = proposer.propose(k)
        n = 0
        while n < len(draft) and done + n < len(answer) and draft[n] == answer[done + n]:
            n += 1
        drafted, accepted = drafted + len(draft), accepted + n
        if n < len(draft) and done + n < len(answer):
            rejected.append(draft[n:])
        step = answer[done : done + n + 1]
        proposer.extend(step)
        done += len(step)
    return drafted, accepted, rejected


def test_a_copy_follows_its_source_through_near_identical_functions():
    """The held-out failure: editing a file whose functions repeat near-identical lines, a short match
    after each edit continued the most recent occurrence (another function) instead of the one copied."""
    def function(name: int, factor: int, arg: int) -> list[int]:
        # def NAME(ARG):\n    y = ARG + 1\n    y = y - ARG\n    return y * FACTOR\n
        return [90, name, 91, arg, 92, 93, 10, 11, 94, arg, 95, 96, 10, 11, 94, 11, 97, arg, 10, 12, 11, 98, factor, 10]

    x, z = 50, 51  # the edit renames the argument x to z in every function
    names, factors = (60, 61, 62, 63), (70, 71, 72, 73)
    prompt = [1, 80, 81, 10] + [t for n, f in zip(names, factors) for t in function(n, f, x)]
    answer = [t for n, f in zip(names, factors) for t in function(n, f, z)]
    drafted, accepted, rejected = replay(prompt, answer)
    # After the first draft (which continues the prompt's own last function), every rejection is a drafted
    # x where the answer writes z, until the rename is learned; never another function's name or factor.
    assert all(part[0] == x for part in rejected[1:]), rejected
    assert len(rejected) <= 4 and accepted >= 0.6 * drafted
