"""Pass costs remembered across sessions: the file, and a real decoder writing and reading it."""

from __future__ import annotations

import json

import pytest

from localspec import paths
from localspec.engine.llama.model import Model
from localspec.engine.persist.pass_costs import MAX_ENTRIES, PassCostMemory
from localspec.session import ModelOptions, Pair, open_decoder, remember_pass_costs


def test_costs_round_trip_per_identity(tmp_path):
    path = tmp_path / "pass-costs.json"
    here, there = PassCostMemory(path, "model A | cpu X"), PassCostMemory(path, "model A | cpu Y")
    here.save({2: 1.05, 32: 5.5})
    here.save({64: 9.0})  # merged with what is there
    assert here.load() == {2: 1.05, 32: 5.5, 64: 9.0}
    assert there.load() == {}


@pytest.mark.parametrize("content", ["", "{not json", "[1, 2]", '{"model A": {"2": "fast", "x": 1.0, "4": -1, "8": Infinity}}'])
def test_a_damaged_file_counts_as_empty_and_is_rewritten(tmp_path, content):
    path = tmp_path / "pass-costs.json"
    memory = PassCostMemory(path, "model A")
    path.write_text(content.replace('"model A"', json.dumps(memory.identity)))
    assert memory.load() == {}
    memory.save({8: 2.5})
    assert memory.load() == {8: 2.5}
    assert [p.name for p in tmp_path.iterdir()] == ["pass-costs.json"]  # no temporary file left


def test_entries_of_an_earlier_version_are_not_read(tmp_path):
    """Version 1 remembered large prompt passes as verifications of their size, a third too cheap."""
    path = tmp_path / "pass-costs.json"
    path.write_text(json.dumps({"model A": {"2": 1.3, "65": 25.5}}))
    memory = PassCostMemory(path, "model A")
    assert memory.load() == {}
    memory.save({2: 1.35})
    assert memory.load() == {2: 1.35}


def test_an_unwritable_place_is_skipped_and_leaves_nothing_behind(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    memory = PassCostMemory(blocker / "pass-costs.json", "model A")
    memory.save({2: 1.0})  # its directory cannot be made: a file is in the way
    assert memory.load() == {}
    assert [p.name for p in tmp_path.iterdir()] == ["file"] and blocker.read_text() == ""


def test_only_the_latest_machines_and_models_are_kept(tmp_path):
    path = tmp_path / "pass-costs.json"
    for i in range(MAX_ENTRIES + 3):
        PassCostMemory(path, f"model {i}").save({2: 1.0})
    kept = json.loads(path.read_text())
    first, last = (PassCostMemory(path, f"model {i}").identity for i in (0, MAX_ENTRIES + 2))
    assert len(kept) == MAX_ENTRIES and first not in kept and last in kept


def test_a_session_remembers_its_pass_costs_for_the_next(tiny_target):
    pair, options = Pair(tiny_target, None, "tiny"), ModelOptions(n_ctx=256, threads=1)
    first = open_decoder(pair, options, method="lookup", draft_len=4, history=False)
    target = first.target
    memory = PassCostMemory(paths.pass_costs_file(), target.cost_identity())
    prompt = target.tokenize("the cat sat on the mat. the cat sat on the mat. the cat", add_bos=True)
    for _ in range(3):
        target.reset()
        list(first.generate(prompt, max_tokens=40))
    measured = first.controller.costs.relative_costs()
    assert measured and set(measured) <= set(range(2, 6))
    assert memory.load() == pytest.approx({b: round(r, 4) for b, r in measured.items()}, abs=1e-4)
    second = open_decoder(pair, options, method="lookup", history=False)
    remembered = memory.load()
    # All of it, but a size dearer than a larger one (stale: see Costs.remember).
    kept = {b: r for b, r in remembered.items() if all(r <= other for size, other in remembered.items() if size > b)}
    assert second.controller.costs.relative_costs() == pytest.approx(kept)
    # Another thread count prices passes differently: it starts from nothing.
    other = Model(tiny_target, n_ctx=256, n_threads=2)
    assert PassCostMemory(paths.pass_costs_file(), other.cost_identity()).load() == {}


def test_a_decoder_that_measured_nothing_does_not_write_back_a_stale_cost(tiny_target):
    """A bench saves each of its decoders' costs in turn: `none`, which passes only one token at a time,
    used to write the remembered 5-token cost back over what `lookup` had just measured of it."""
    pair, options = Pair(tiny_target, None, "tiny"), ModelOptions(n_ctx=256, threads=1)
    probe = Model(tiny_target, n_ctx=256, n_threads=1)
    memory = PassCostMemory(paths.pass_costs_file(), probe.cost_identity())
    memory.save({5: 99.0})  # stale: no 5-token pass costs 99 one-token passes
    drafting = open_decoder(pair, options, method="lookup", draft_len=4, history=False)
    idle = drafting.sibling(method="none", draft_len=None, history=None)
    prompt = drafting.target.tokenize("the cat sat on the mat. the cat sat on the mat. the cat", add_bos=True)
    for decoder in (drafting, idle):
        for _ in range(3):
            decoder.target.reset()
            list(decoder.generate(prompt, max_tokens=40))
    measured = drafting.controller.costs.relative_costs()[5]
    assert measured < 10
    remember_pass_costs([drafting, idle])
    assert memory.load()[5] == pytest.approx(measured, abs=1e-4)
