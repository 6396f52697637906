"""scripts/train_head: an EAGLE-3 head trained in JAX on the target's own layer inputs.

On the suite's tiny llama target (tests/tiny_models.py): the JAX forward pass, chained steps included, is
the pinned llama.cpp eagle3 graph (same logits for the same weights, through localspec's EAGLE-3 head
context); a sampled answer is labelled with the target's greedy token at every position; a short
training run lowers its loss and drafts better on held-back prompts than a seeded-random
head; the head it writes passes `check` and drafts without changing greedy output.
"""

from __future__ import annotations

import contextlib
import io
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

from localspec.bench.workloads import BenchPrompt
from localspec.cli.app import app
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.llama.heads import Eagle3Head
from localspec.engine.llama.model import Model
from scripts.train_head.__main__ import main
from scripts.train_head.capture import Capture
from scripts.train_head.head import HeadShape, chained_forward, init_params
from scripts.train_head.layout import default_layers
from scripts.train_head.target_file import borrowed_weights, target_info, write_head
from tests.test_companion_heads import generate, make_decoder
from tests.tiny_models import TinySpec, write_tiny_eagle3_head, write_tiny_model

TARGET = TinySpec(seed=4, n_layers=3, logit_scale=4.0)
LAYERS = default_layers(TARGET.n_layers)
PROMPT = "hello world the code print x = hello world the code"
TRAIN_PROMPTS = [f"{a} {b}" for a in ("hello", "print the", "x = code", "world of", "the code is", "say")
                 for b in ("world", "x", "hello code", "print world", "the the", "x = 1")]
HELD_PROMPTS = ["code the world", "print hello x", "world = the code", "hello hello print"]


def prompt_file(path, prompts):
    path.write_text("".join(json.dumps({"workload": "chat", "id": f"p{i}", "prompt": p}) + "\n"
                            for i, p in enumerate(prompts)))
    return path


def test_the_jax_forward_is_llama_cpps_eagle3_graph(tmp_path):
    """Same weights, same inputs: g, the head's state and its logits (written to the target ids d2t names,
    every other token -inf) agree with llama.cpp's for the target-fed entries and for two chained steps
    on the head's own state. Norms are random so that no two of them can be swapped unseen."""
    target_path = write_tiny_model(tmp_path / "target.gguf", TARGET)
    info = target_info(target_path)
    embed, output_norm, output = borrowed_weights(target_path)
    rng = np.random.default_rng(1)
    d2t = rng.permutation(len(embed))[:40]
    shape = HeadShape(n_embd=info.n_embd, n_head=info.n_head, head_dim=info.n_embd // info.n_head,
                      n_ff=info.n_ff, n_features=3 * info.n_embd, draft_vocab=len(d2t))
    params = {name: value * rng.uniform(0.5, 1.5, value.shape).astype(np.float32) if value.ndim == 1 else value
              for name, value in init_params(shape, output_norm, output[d2t], seed=2).items()}
    head_path = write_head(tmp_path / "head.gguf", info, shape, LAYERS, params, d2t, f16=False)

    model = Model(target_path, n_ctx=256, n_threads=1)
    model.capture_layer_inputs(LAYERS)
    context = model.tokenize(PROMPT, add_bos=True)
    model.eval(context)
    features = model.features[: len(context) - 1].copy()
    head = Eagle3Head(head_path, model, features=shape.n_features)
    chain = [17, 23]
    try:
        g = head.encode(features)
        ours = [head.eval(context[1:], g)]
        for token in chain:
            ours.append(head.eval([token], ours[-1][1][None, :]))
    finally:
        head.close()
        model.close()

    tokens = jnp.asarray([context[1:] + chain])
    jax_steps = chained_forward(params, shape, jnp.asarray(embed), tokens, jnp.asarray(features[None]), 3)
    np.testing.assert_allclose(g, np.asarray(features @ np.asarray(params["fc.weight"]).T), rtol=1e-4, atol=1e-4)
    last = len(context) - 2  # the base entry the chain grows from
    for (logits, state), (jax_state, jax_logits) in zip(ours, jax_steps):
        np.testing.assert_allclose(state, np.asarray(jax_state[0, last]), rtol=2e-3, atol=2e-3)
        np.testing.assert_allclose(logits[d2t], np.asarray(jax_logits[0, last]), rtol=2e-3, atol=2e-3)
        assert np.isneginf(np.delete(logits, d2t)).all()
        assert int(np.argmax(logits)) == int(d2t[np.argmax(jax_logits[0, last])])


def test_a_sampled_answer_is_labelled_with_the_greedy_token_at_every_position(tmp_path):
    target_path = write_tiny_model(tmp_path / "target.gguf", TARGET)
    model = Model(target_path, n_ctx=256, n_threads=1)
    try:
        capture = Capture(model, LAYERS)
        prompt = BenchPrompt(workload="chat", id="p", turns=(PROMPT,))
        greedy = capture.answer(prompt, 32)
        sampled = capture.answer(prompt, 32, SamplingParams(temperature=1.5, seed=3))
        assert sampled.first == greedy.first
        answer = slice(sampled.first + 1, None)
        assert sampled.tokens[answer].tolist() != greedy.tokens[answer].tolist()  # text greedy never writes
        checked = 0
        for at in range(sampled.first, len(sampled.labels), 5):
            # the target's greedy next token after this prefix, decoded afresh
            model.reset()
            alone = capture.decoder.generate(sampled.tokens[: at + 1].tolist(), max_tokens=1)
            assert sampled.labels[at] == next(alone).tokens[0], at
            checked += 1
        assert checked >= 4
    finally:
        model.close()


def acceptance(target_path, head_path, prompts) -> tuple[float, list[int]]:
    """The head's greedy draft acceptance over ``prompts`` through the decoder, and whether each output
    equals the target alone's (asserted)."""
    drafted = accepted = 0
    for text in prompts:
        baseline = make_decoder((target_path, head_path), method="none")
        prompt = baseline.target.tokenize(text, add_bos=True)
        expected = generate(baseline, prompt)
        decoder = make_decoder((target_path, head_path), method="eagle3", draft_len=3)
        assert generate(decoder, prompt) == expected
        drafted += decoder.stats.drafted_by_source.get("eagle3", 0)
        accepted += decoder.stats.accepted_by_source.get("eagle3", 0)
    return accepted / max(drafted, 1), drafted


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("train-head")
    target_path = write_tiny_model(folder / "target.gguf", TARGET)
    (folder / "notes.txt").write_text(" ".join(TRAIN_PROMPTS) * 3)
    args = ["--target", str(target_path), "--out", str(folder / "head.gguf"), "--work", str(folder / "work"),
            "--prompts", str(prompt_file(folder / "train.jsonl", TRAIN_PROMPTS)),
            "--held", str(prompt_file(folder / "held.jsonl", HELD_PROMPTS)), "--text", str(folder / "notes.txt"),
            "--minutes", "0.25", "--max-tokens", "48", "--window", "64", "--batch", "8", "--lr", "3e-3",
            "--draft-vocab", "200", "--f32"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(args) == 0
    return target_path, folder / "head.gguf", out.getvalue()


def test_training_lowers_the_loss_and_drafts_better_than_a_seeded_head(trained):
    target_path, head_path, out = trained
    losses = [float(x) for x in re.findall(r"epoch \d+: loss ([\d.]+)", out)]
    assert len(losses) >= 2 and losses[-1] < 0.8 * losses[0], out
    assert re.search(r"first-token top-1 acceptance on held-back answers ([\d.]+)", out), out

    seeded = write_tiny_eagle3_head(head_path.with_name("seeded.gguf"), TARGET, LAYERS)
    trained_rate, drafted = acceptance(target_path, head_path, HELD_PROMPTS)
    seeded_rate, _ = acceptance(target_path, seeded, HELD_PROMPTS)
    assert drafted > 0 and trained_rate > seeded_rate + 0.1, (trained_rate, seeded_rate)


def test_the_written_head_passes_check_and_drafts_through_the_cli(trained):
    target_path, head_path, _ = trained
    result = CliRunner().invoke(app, ["check", str(target_path), str(head_path), "--json"])
    assert result.exit_code == 0, result.output
    runner = CliRunner()
    plain = runner.invoke(app, ["run", "--target", str(target_path), "--method", "none", "-n", "40",
                                "--no-history", "--json", PROMPT])
    drafted = runner.invoke(app, ["run", "--target", str(target_path), "--draft", str(head_path), "--method", "eagle3",
                                  "-n", "40", "--no-history", "--json", PROMPT])
    assert plain.exit_code == 0 and drafted.exit_code == 0, (plain.output, drafted.output)
    assert json.loads(drafted.stdout)["text"] == json.loads(plain.stdout)["text"]


def test_bad_input_is_one_line_naming_the_fix(tmp_path, capsys):
    assert main(["--target", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "h.gguf")]) == 1
    assert "give the target model's GGUF with --target" in capsys.readouterr().err
    head = write_tiny_eagle3_head(tmp_path / "head.gguf", TARGET, LAYERS)
    assert main(["--target", str(head), "--out", str(tmp_path / "h.gguf")]) == 1
    err = capsys.readouterr().err
    assert "'eagle3' model" in err and "give a target of one of" in err and len(err.strip().splitlines()) == 1
