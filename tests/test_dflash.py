"""What only a DFlash head does (the behaviour it shares with EAGLE-3 heads: test_companion_heads.py):
a block per pass, never past the trained block, priced as one pass of its rows; its descendants refused."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from localspec.cli.app import app
from localspec.engine.drafters.base import Offer
from localspec.engine.drafters.dflash import DFlashDrafter
from localspec.engine.drafters.mtp import MtpDrafter
from localspec.engine.planner.controller import Controller
from tests.test_companion_heads import LAYERS, PROMPT, TARGET, check_json, generate, make_decoder
from tests.tiny_models import write_tiny_dflash_head, write_tiny_model


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dflash")
    target = write_tiny_model(folder / "target.gguf", TARGET)
    return target, write_tiny_dflash_head(folder / "head.gguf", TARGET, LAYERS)


def test_a_draft_never_runs_past_the_trained_block(pair):
    """The head is trained on blocks of 8 (the last token and 7 masks): a longer draft is cut to 7."""
    baseline = make_decoder(pair, method="none")
    prompt = baseline.target.tokenize(PROMPT, add_bos=True)
    expected = generate(baseline, prompt, max_tokens=30)
    decoder = make_decoder(pair, draft_len=12)
    rounds = list(decoder.generate(prompt, max_tokens=30))
    assert [t for step in rounds for t in step.tokens] == expected
    assert max(step.drafted for step in rounds) == 7


@pytest.mark.parametrize("key,value,named", [
    ("dflash.selector_top_k", 4, "a DFlash2 head"),
    ("dflash.sample_from_anchor", True, "a DSpark head"),
])
def test_a_dflash_descendant_is_refused_up_front_with_the_reason(pair, tmp_path, key, value, named):
    head = write_tiny_dflash_head(tmp_path / "variant.gguf", TARGET, LAYERS, extra={key: value})
    code, report = check_json(str(pair[0]), str(head))
    assert code == 1
    assert named in report["first_reason"] and "draft-dflash or draft-dspark" in report["first_reason"]
    # Alone, it is not offered as a draft either.
    code, report = check_json(str(head))
    detail = next(f for f in report["findings"] if f["code"] == "heads")["detail"]
    assert named in detail and "draft-dflash or draft-dspark" in detail and "give it as the draft" not in detail
    result = CliRunner().invoke(app, ["run", "--threads", "1", PROMPT, "--target", str(pair[0]), "--draft", str(head),
                                      "--raw", "--method", "dflash", "-n", "8"])
    assert result.exit_code != 0 and (result.exception is None or isinstance(result.exception, SystemExit))
    assert named in result.output and "Traceback" not in result.output


def test_a_block_is_priced_as_one_pass_of_its_rows_not_a_step_per_token():
    """A head whose one-row pass costs 0.3 of a target pass: drafting 6 tokens costs one 7-row pass of it
    (scaled like the target's 7-row pass), where a chained head pays 6 steps."""
    plans = {}
    for cls in (DFlashDrafter, MtpDrafter):
        controller = Controller(cls.source, drafters=[cls])
        for _ in range(3):
            controller.costs.record_pass(1, 0.100)
        for size in range(2, 17):
            for _ in range(3):
                controller.costs.record_pass(size, 0.100 * (1 + 0.25 * (size - 1)))
        rows = 7 if cls.block else 6
        steps_s = 0.030 * (1 + 0.25 * (rows - 1)) if cls.block else 0.030 * rows
        controller.record_draft(cls.source, 0, 0.0, rows, steps_s)
        assert controller.step_cost(cls.source) == pytest.approx(0.030)
        controller.record_round(cls.source, 6, 6)
        plans[cls.source] = controller.plan([Offer(cls.source, 16)])
    block, chained = plans["dflash"], plans["mtp"]
    assert block.k > chained.k
    # The block's expected rate: its tokens over the target's pass and the head's pass, both of k + 1 rows.
    rows = 1 + 0.25 * block.k
    assert block.expected_rate == pytest.approx(block.expected_tokens / (0.100 * rows + 0.030 * rows), rel=0.02)
