"""The on-disk answer history: private, bounded, atomic, and a damaged file is read as empty, never a crash."""

from __future__ import annotations

import stat

import pytest

from localspec import paths
from localspec.engine.drafters.suffix_index import SEPARATOR
from localspec.engine.llama.model import Model
from localspec.engine.persist.history import LEAD_TOKENS, HistoryStore, tokenizer_identity


@pytest.fixture
def history_file(localspec_home):
    return paths.history_dir() / "abc.bin"


def test_answers_survive_a_restart_with_their_lead_in(history_file):
    store = HistoryStore(history_file)
    store.add([100, 101, 1, 2, 3, 4, 5], [6, 7, 8, 9])
    assert not history_file.exists()  # adding learns in memory; the session saves after each answer
    store.save()
    again = HistoryStore(history_file)
    assert again.index.tokens.tolist() == [2, 3, 4, 5, 6, 7, 8, 9, SEPARATOR][-(LEAD_TOKENS + 5) :]
    assert again.index.propose([3, 4, 5], 8).tokens == [6, 7, 8, 9]


def test_the_history_is_readable_by_its_owner_only(history_file):
    store = HistoryStore(history_file)
    store.add([1, 2, 3], [4, 5])
    store.save()
    assert stat.S_IMODE(history_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(history_file.parent.stat().st_mode) == 0o700
    assert [p.name for p in history_file.parent.iterdir()] == [history_file.name]  # no temp file left


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[:-3],  # truncated mid-token
        lambda data: data[:10],  # truncated in the header
        lambda data: data[:-4] + b"\x07\x00\x00\x00",  # a flipped token: the checksum fails
        lambda data: b"NOTHIST!" + data[8:],  # another format
        lambda data: b"",
    ],
    ids=["torn-token", "torn-header", "bit-rot", "foreign", "empty"],
)
def test_a_damaged_file_is_read_as_empty_and_rewritten(history_file, damage):
    first = HistoryStore(history_file)
    first.add([1, 2, 3], [4, 5, 6])
    first.save()
    history_file.write_bytes(damage(history_file.read_bytes()))
    store = HistoryStore(history_file)
    assert len(store) == 0
    store.add([7, 8, 9], [10])
    store.save()
    assert HistoryStore(history_file).index.tokens.tolist() == [7, 8, 9, 10, SEPARATOR]


def test_the_oldest_answers_are_dropped_past_the_bound(history_file):
    store = HistoryStore(history_file, max_tokens=20)
    for answer in range(10):
        store.add([], [answer] * 4)  # 5 tokens each with its separator
    store.save()
    kept = HistoryStore(history_file, max_tokens=20).index.tokens.tolist()
    assert len(kept) <= 20
    assert kept[-5:] == [9, 9, 9, 9, SEPARATOR]  # whole answers, newest last
    assert kept[0] != SEPARATOR and kept[-1] == SEPARATOR


def test_a_store_without_a_path_never_writes(localspec_home):
    store = HistoryStore(None)
    store.add([1, 2, 3], [4, 5])
    store.save()
    assert len(store) > 0
    assert not paths.history_dir().exists()


def test_a_store_not_learning_keeps_what_it_has(history_file):
    store = HistoryStore(history_file)
    store.learning = False
    store.add([1, 2, 3], [4, 5])
    store.save()
    assert len(store) == 0 and not history_file.exists()


def test_draft_outcomes_are_scored_only_while_learning(history_file):
    store = HistoryStore(history_file)
    store.add([], [1, 2, 3, 4, 5, 6])
    store.learning = False
    for _ in range(3):
        store.record(store.index.propose([1, 2, 3], 8).sources, accepted=1)
    assert store.index.propose([1, 2, 3], 8).tokens == [4, 5, 6]  # the benchmark's repeats see the same drafts
    store.learning = True
    for _ in range(3):
        store.record(store.index.propose([1, 2, 3], 8).sources, accepted=1)
    assert store.index.propose([1, 2, 3], 8).tokens == [4]


def test_tokenizer_identity_follows_the_vocabulary_not_the_weights(make_tiny_model, tiny_target, tiny_draft):
    def identity(path):
        return tokenizer_identity(Model(path, vocab_only=True))

    assert identity(tiny_target) == identity(tiny_draft)  # other weights, same tokenizer
    other = make_tiny_model("other-vocab", tokens=[f"<t{i}>" for i in range(300)])
    assert identity(other) != identity(tiny_target)
    paths.check_component(identity(tiny_target), "history name")
