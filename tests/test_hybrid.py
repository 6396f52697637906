"""Hybrid and recurrent targets (Qwen3.5-style Gated DeltaNet, LFM2, Mamba) on tiny generated models.

llama.cpp cannot cut positions out of a recurrent state as it cuts a KV cache: it refuses, or (past
the snapshots of the last pass) would decode on a state built on rejected tokens. Every test here
checks output or logits against the target alone, from a fresh context where it matters.
"""

from __future__ import annotations

import numpy as np
import pytest

from localspec.conversation import Conversation
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.llama.memory import CHECKPOINT, SNAPSHOTS
from localspec.engine.llama.model import Model
from localspec.gguf.memory import MemoryKind, memory_kind
from tests.test_decoder import ALPHA, exact_sequence_distribution, sequence_pvalue

# (architecture, snapshots per pass): qwen35 and lfm2 roll back in place within their snapshots, and by
# checkpoint and replay without them; mamba has none in llama.cpp.
CASES = [("qwen35", 8), ("qwen35", 0), ("lfm2", 8), ("mamba", 0)]
PROMPT = "hello world the code print x = hello world the code"
N_CTX = 512


@pytest.fixture(scope="module", params=CASES, ids=[f"{a}-{'snapshots' if n else 'checkpoint'}" for a, n in CASES])
def hybrid(request, make_tiny_model):
    """(architecture, target path, draft path, load options): the draft is the target with seeded noise,
    so it agrees often but not always."""
    arch, snapshots = request.param
    target = make_tiny_model(f"{arch}-target", architecture=arch, seed=3, logit_scale=8.0)
    draft = make_tiny_model(f"{arch}-draft", architecture=arch, seed=3, logit_scale=8.0, perturb_seed=1,
                            perturb_scale=0.5)
    return arch, target, draft, {"rollback_snapshots": snapshots}


def load(path, **options) -> Model:
    return Model(path, n_ctx=N_CTX, n_threads=1, **options)


def make_decoder(target, draft=None, *, method="auto", draft_len=None, **options) -> SpeculativeDecoder:
    """As session.open_decoder: the draft keeps no snapshots (its one-token passes leave none to use)."""
    proposer = DraftModelDrafter(lambda: load(draft), min_confidence=0.0) if draft else None
    return SpeculativeDecoder(load(target, **options), draft=proposer, method=method, draft_len=draft_len)


def generate(decoder, prompt, max_tokens=40, sampling=SamplingParams()):
    return [t for step in decoder.generate(prompt, max_tokens=max_tokens, sampling=sampling) for t in step.tokens]


class PlantedMistakes:
    """A lookup stand-in that drafts the target's own greedy answer with a wrong token planted in every
    other draft, so rounds alternate between full and partial acceptance (rollbacks of every length)."""

    def __init__(self, prompt_len: int, answer: list[int], wrong: int) -> None:
        self.history: list[int] = []
        self.prompt_len, self.answer, self.wrong = prompt_len, answer, wrong
        self.last_match_len = 8
        self.rounds = 0

    def truncate(self, n: int) -> None:
        del self.history[n:]

    def extend(self, tokens) -> None:
        self.history.extend(tokens)

    def propose(self, k: int) -> list[int]:
        done = len(self.history) - self.prompt_len
        draft = list(self.answer[done : done + k])
        self.rounds += 1
        if self.rounds % 2 and draft:
            draft[min(len(draft) - 1, self.rounds % 5)] = self.wrong
        return draft


@pytest.fixture(scope="module")
def baseline(hybrid):
    arch, target, draft, options = hybrid
    decoder = make_decoder(target, method="none", **options)
    prompt = decoder.target.tokenize(PROMPT, add_bos=True)
    return prompt, generate(decoder, prompt)


def test_memory_kind_is_detected_and_matches_the_header_table(hybrid):
    arch, target, _, options = hybrid
    plan = load(target, **options).memory_plan
    assert plan.memory == memory_kind(arch) == (MemoryKind.RECURRENT if arch == "mamba" else MemoryKind.HYBRID)
    # llama.cpp keeps the snapshots asked for with qwen35 and lfm2, and clamps mamba's to none.
    assert plan.method == (SNAPSHOTS if options["rollback_snapshots"] else CHECKPOINT)
    assert load(target, rollback_snapshots=8).memory_plan.method == (CHECKPOINT if arch == "mamba" else SNAPSHOTS)
    assert plan.checkpoint_bytes > 0 and plan.refused is None


def test_a_dense_model_keeps_its_kv_cache_plan(tiny_target):
    plan = load(tiny_target).memory_plan
    assert (plan.memory, plan.method, plan.checkpoint_bytes) == (MemoryKind.KV, "kv", 0)


@pytest.mark.parametrize("drop", [1, 3, 6, 9])
def test_rollback_gives_the_logits_of_a_fresh_context(hybrid, drop):
    """Within the last pass's snapshots, past them, and past the pass itself: never a state built on
    removed tokens, and never a silent refusal."""
    _, target, _, options = hybrid
    model, fresh = load(target, **options), load(target)
    tokens = model.tokenize(PROMPT, add_bos=True)
    model.eval(tokens[:5], n_logits=0)
    model.eval(tokens[5:12], n_logits=0)  # a 7-token pass, as a verification of 6 drafts
    keep = 12 - drop
    model.rollback(keep)
    assert model.tokens == tokens[:keep]
    after = model.eval(tokens[keep:14], n_logits=1)[0]
    expected = fresh.eval(tokens[:14], n_logits=1)[0]
    np.testing.assert_allclose(after, expected, rtol=1e-4, atol=1e-4)


def test_llama_cpp_refuses_a_partial_rollback_of_a_plain_recurrent_state(make_tiny_model):
    """The premise: seq_rm on Mamba's state fails and keeps the state. Model must then restore or
    re-evaluate, and says so in replayed_tokens."""
    path = make_tiny_model("mamba-target", architecture="mamba", seed=3, logit_scale=8.0)
    model = load(path)
    tokens = model.tokenize(PROMPT, add_bos=True)[:10]
    model.eval(tokens, n_logits=0)
    assert not model._lib.llama_memory_seq_rm(model._ctx.memory, 0, 8, -1)
    model.rollback(8)
    assert model.replayed_tokens == 8 and model.tokens == tokens[:8]


def test_checkpoint_restore_replays_only_the_tokens_after_it(hybrid):
    _, target, _, options = hybrid
    model = load(target, rollback_snapshots=0)
    tokens = model.tokenize(PROMPT, add_bos=True)
    model.eval(tokens[:10], n_logits=0)
    model.checkpoint()
    model.eval(tokens[10:16], n_logits=0)
    model.rollback(12)
    assert model.replayed_tokens == 2
    np.testing.assert_allclose(
        model.eval(tokens[12:14])[0], load(target).eval(tokens[:14])[0], rtol=1e-4, atol=1e-4
    )


@pytest.mark.parametrize("method,draft_len", [("lookup", 4), ("lookup", 12), ("auto", None)])
def test_planted_mistakes_roll_back_to_the_target_alone_output(hybrid, baseline, method, draft_len):
    """Drafts of 4 fit in 8 snapshots, 12 do not (a checkpoint, restore and replay)."""
    _, target, _, options = hybrid
    prompt, expected = baseline
    decoder = make_decoder(target, method=method, draft_len=draft_len, **options)
    wrong = next(t for t in range(3, 300) if t not in expected)
    decoder.drafter("lookup").proposer = PlantedMistakes(len(prompt), expected, wrong)
    planted = decoder.drafter("lookup").proposer
    assert generate(decoder, prompt) == expected
    stats = decoder.stats
    assert planted.rounds > 0, "the planted drafts were never asked for"
    if method != "auto":
        assert 0 < stats.accepted < stats.drafted, "no partial acceptance: no rollback was tested"


@pytest.mark.parametrize("method,draft_len", [("draft", 3), ("hybrid", 4), ("lookup", None), ("auto", None)])
def test_greedy_output_of_every_method_equals_target_alone(hybrid, baseline, method, draft_len):
    """A hybrid draft model too: its own state rolls back through a checkpoint every round."""
    _, target, draft, options = hybrid
    prompt, expected = baseline
    decoder = make_decoder(target, draft, method=method, draft_len=draft_len, **options)
    assert generate(decoder, prompt) == expected
    if method == "draft":
        assert 0 < decoder.stats.accepted < decoder.stats.drafted


def test_three_turn_chat_equals_the_target_alone(hybrid):
    _, target, draft, options = hybrid
    questions = ["the code print x", "hello world the code", "def return x = x + x"]
    answers = {}
    for method in ("none", "lookup", "draft"):
        conversation = Conversation(make_decoder(target, draft, method=method, draft_len=3, **options))
        answers[method] = ["".join(p.text for p in conversation.ask(q, max_tokens=24)) for q in questions]
    assert answers["lookup"] == answers["none"] == answers["draft"]


def test_stopping_early_leaves_the_state_consistent(hybrid, baseline):
    """A consumer that breaks mid-answer (Ctrl-C, a stop string), then the same prompt again."""
    _, target, draft, options = hybrid
    prompt, expected = baseline
    decoder = make_decoder(target, draft, method="draft", draft_len=4, **options)
    for i, _ in enumerate(decoder.generate(prompt, max_tokens=40)):
        if i == 3:
            break
    assert generate(decoder, prompt) == expected


def test_sampled_output_follows_the_target_distribution(make_tiny_model):
    """Qwen3.5-style target and draft, sampling: the rollbacks must not bend the distribution."""
    target = make_tiny_model("qwen35-spread", architecture="qwen35", seed=5, logit_scale=2.0)
    draft = make_tiny_model("qwen35-spread-draft", architecture="qwen35", seed=5, logit_scale=2.0,
                            perturb_seed=9, perturb_scale=0.4)
    prompt = load(target, vocab_only=True).tokenize("hello world", add_bos=True)
    dist = exact_sequence_distribution(target, prompt)
    decoder = make_decoder(target, draft, method="draft", draft_len=2)
    pvalue, drafted, accepted = sequence_pvalue(decoder, prompt, dist)
    assert pvalue > ALPHA
    assert 0.1 * drafted < accepted < 0.9 * drafted


@pytest.mark.parametrize("k", [2, 5, 17, 33])
def test_verification_is_bit_identical_to_one_token_steps(hybrid, k):
    """Exactness: the recurrent kernels (Gated DeltaNet, short conv, SSM scan) give a k-row pass the bits
    of k one-row passes in this build, so hybrids verify in exact mode like dense models."""
    _, target, _, options = hybrid
    batched, stepped = load(target, **options), load(target, **options)
    tokens = (batched.tokenize(PROMPT, add_bos=True) * 4)[: 6 + k]
    for model in (batched, stepped):
        model.eval(tokens[:6], n_logits=0, prefill=True)
    rows = batched.eval(tokens[6:], n_logits=k)
    steps = np.stack([stepped.eval([t])[0] for t in tokens[6:]])
    assert batched.kernels == "exact"
    assert np.array_equal(rows, steps)


def test_one_token_passes_leave_no_snapshots_to_roll_back_through(make_tiny_model):
    """llama.cpp accepts a snapshot rollback after one-token passes (a draft model's steps) but its
    snapshots are of an older pass; Model must not use them."""
    path = make_tiny_model("qwen35-target", architecture="qwen35", seed=3, logit_scale=8.0)
    model, fresh = load(path), load(path)
    tokens = model.tokenize(PROMPT, add_bos=True)
    model.eval(tokens[:8], n_logits=0)
    model.checkpoint()
    for token in tokens[8:12]:
        model.eval([token])
    model.rollback(9)
    np.testing.assert_allclose(model.eval(tokens[9:11])[0], fresh.eval(tokens[:11])[0], rtol=1e-4, atol=1e-4)


def test_three_sequential_requests_equal_a_fresh_servers(hybrid):
    from localspec.session import ModelOptions, Pair, open_decoder

    _, target, draft, options = hybrid
    assert_serve_answers_as_fresh_servers_would(
        lambda: open_decoder(Pair(target, draft, "tiny"), ModelOptions(n_ctx=N_CTX, threads=1, **options))
    )


def assert_serve_answers_as_fresh_servers_would(open_decoder) -> None:
    """serve keeps the cache between requests: a continued conversation, then an unrelated one."""
    from localspec.server.worker import GenerationWorker
    from tests.test_server import SYSTEM, client, serving

    first = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "the code print x"}]

    def worker():
        return GenerationWorker(open_decoder(), SamplingParams(temperature=0.0), max_queue=2)

    def answer(server, conversation):
        reply = client(server).chat.completions.create(model="tiny", messages=conversation, max_tokens=24,
                                                       temperature=0)
        return reply.choices[0].message.content

    with serving(worker()) as server:
        one = answer(server, first)
        second = first + [{"role": "assistant", "content": one}, {"role": "user", "content": "hello world"}]
        third = [{"role": "user", "content": "def return x = x + x"}]
        answers = [one, answer(server, second), answer(server, third)]
    for conversation, expected in zip((first, second, third), answers):
        with serving(worker()) as fresh:
            assert answer(fresh, conversation) == expected


def test_the_live_view_and_json_stats_say_how_the_state_rolls_back(hybrid, baseline):
    import io

    from rich.console import Console

    from localspec.engine.decoding.text import stream_text
    from localspec.tui import LiveView

    arch, target, _, options = hybrid
    prompt, _ = baseline
    decoder = make_decoder(target, method="lookup", draft_len=12, **options)
    view = LiveView(Console(file=io.StringIO(), force_terminal=True, width=120), decoder)
    view.stream(list(stream_text(decoder.target, decoder.generate(prompt, max_tokens=30))))
    status = view.status_text(decoder.stats, 1.0).plain
    expected = "8 snapshots per pass" if options["rollback_snapshots"] else "checkpoint before each verification"
    assert f"memory {memory_kind(arch)}" in status and expected in status
    assert decoder.stats.to_dict()["memory"] == decoder.target.memory_plan.describe()


def test_remembered_pass_costs_are_kept_apart_per_rollback_method(hybrid, tiny_target):
    """Snapshots are written on every pass, so their costs must not seed a context without them."""
    arch, target, _, options = hybrid
    with_snapshots, without = load(target, rollback_snapshots=8).cost_identity(), load(target).cost_identity()
    assert (with_snapshots != without) == (arch != "mamba")  # mamba has no snapshots either way
    assert "memory" not in load(tiny_target).cost_identity()  # a dense model's costs stay where they were


def test_run_on_a_hybrid_target_as_a_new_user_would(hybrid):
    """The reported failure: `run --method lookup` died with llama_decode -1 at the first rejection."""
    import json

    from typer.testing import CliRunner

    from localspec.cli.app import app

    _, target, _, options = hybrid

    def run(*args):
        result = CliRunner().invoke(app, ["run", PROMPT, "--raw", "--target", str(target), "--temp", "0", "-n", "48",
                                          "--threads", "1", "--json", "--snapshots", str(options["rollback_snapshots"]),
                                          *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    none, lookup = run("--method", "none"), run("--method", "lookup")
    assert lookup["text"] == none["text"] and lookup["stats"]["drafted"] > 0
    assert lookup["stats"]["memory"].startswith(memory_kind(hybrid[0]))
