"""Opening a pair: which files, whether they pair, and the decoder the session builds and feeds."""

from __future__ import annotations

import pytest

from localspec import paths
from localspec.errors import IncompatibleError, PromptTooLong, UsageError
from localspec.session import ModelOptions, Pair, ensure_compatible, open_decoder, resolve_pair

OPTIONS = ModelOptions(n_ctx=256, threads=1)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"draft": "draft.gguf"}, "--draft needs --target"),
        ({"profile": "x", "target": "target.gguf"}, "either --profile or --target"),
        ({"target": "missing.gguf"}, "is not a file"),
    ],
)
def test_bad_pairs_are_one_line_naming_the_fix(tmp_path, kwargs, message):
    kwargs = {k: tmp_path / v if k != "profile" else v for k, v in kwargs.items()}
    with pytest.raises(UsageError, match=message):
        resolve_pair(**kwargs)


def test_an_incompatible_pair_is_refused_unless_forced(tiny_target, make_tiny_model):
    other = make_tiny_model("other-vocab", tokens=["<unk>", "<s>", "</s>", "a", "b", "ab"], merges=["a b"],
                            pre_tokenizer="default")
    pair = Pair(tiny_target, other, "mixed")
    with pytest.raises(IncompatibleError, match="--force to run anyway"):
        ensure_compatible(pair)
    assert not ensure_compatible(pair, force=True).compatible


def test_the_draft_loads_on_first_use_not_at_open(tiny_target, tiny_draft):
    decoder = open_decoder(Pair(tiny_target, tiny_draft, "tiny"), OPTIONS, method="auto")
    assert decoder.draft is not None and not decoder.draft.loaded


def test_the_session_saves_what_was_learnt(tiny_target, tiny_draft):
    # Fixed 4-token drafts: every round is a 5-token pass, so its cost is measured (auto may never draft on
    # a random tiny model, and then there is no pass cost worth remembering).
    decoder = open_decoder(Pair(tiny_target, tiny_draft, "tiny"), OPTIONS, method="draft", draft_len=4)
    history = decoder.history.path
    assert not history.exists() and not paths.pass_costs_file().exists()
    prompt = decoder.target.tokenize("hello world the code", add_bos=True)
    answer = [t for step in decoder.generate(prompt, max_tokens=24) for t in step.tokens]
    # After the answer: the history holds it on disk, the pass costs this machine measured are remembered.
    assert history.exists() and paths.pass_costs_file().exists()
    assert decoder.history.index.tokens[-len(answer) - 1 : -1].tolist() == answer
    # The next session starts from both.
    again = open_decoder(Pair(tiny_target, tiny_draft, "tiny"), OPTIONS, method="draft", draft_len=4)
    assert len(again.history) == len(decoder.history)
    assert again.controller.costs.relative_costs() == pytest.approx(decoder.controller.costs.relative_costs(), abs=1e-4)


def test_without_history_nothing_of_the_answers_is_kept(tiny_target):
    decoder = open_decoder(Pair(tiny_target, None, "tiny"), OPTIONS, method="lookup", history=False)
    prompt = decoder.target.tokenize("hello world", add_bos=True)
    list(decoder.generate(prompt, max_tokens=8))
    assert decoder.history is None and not paths.history_dir().exists()


def test_a_prompt_that_does_not_fit_is_refused_with_its_sizes(tiny_target):
    decoder = open_decoder(Pair(tiny_target, None, "tiny"), OPTIONS, history=False)
    prompt = decoder.target.tokenize("hello world " * 200, add_bos=True)
    with pytest.raises(PromptTooLong) as caught:
        decoder.generate(prompt, max_tokens=8)  # at once, before the first step is asked for
    assert (caught.value.n_prompt, caught.value.n_ctx) == (len(prompt), 256)
    assert "--ctx" not in str(caught.value)  # the engine names no CLI flag; each front end adds its fix
