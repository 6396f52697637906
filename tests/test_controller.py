"""The controller's choices from given costs and acceptance: pure, no model involved."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.engine.decoding.acceptance import verify_sampled
from localspec.engine.decoding.sampling import sample
from localspec.engine.drafters.base import Offer
from localspec.engine.planner.controller import EXPLORE_SHARE, MAX_DRAFT_LEN, REPRICE_ROUNDS, Controller
from localspec.engine.planner.costs import COST_WINDOW, PRIOR_BATCH_SLOPE, RETURN_PASSES, TRUSTED_SAMPLES
from localspec.engine.planner.estimates import expected_tokens
from localspec.errors import UsageError

# Target pass cost by batch size on this 2-core CPU (FACTS.md) and on a GPU-like machine (nearly flat).
CPU = {1: 0.060, 2: 0.093, 3: 0.100, 4: 0.105, 5: 0.125, 8: 0.191, 9: 0.195, 16: 0.235, 17: 0.240}
GPU = {b: 0.020 + 0.0002 * b for b in range(1, 66)}
SHARE = 0.15  # the output projection's share of a token's work (Qwen2.5-Coder-1.5B's shapes)


def choose(controller, *, lookup_available=0, lookup_match_len=0, suffix_available=0, suffix_match_len=0,
         draft_catch_up=lambda: 0, **kwargs):
    """The controller's plan for what the drafters offer: lookup and suffix what is given, a draft model
    (where there is one) up to the controller's limit."""
    offers = [copy_offer("lookup", lookup_available, lookup_match_len),
              copy_offer("suffix", suffix_available, suffix_match_len)]
    if controller.has_draft_model:
        offers.append(Offer("draft", controller.draft_limit, catch_up=draft_catch_up))
    return controller.plan(offers, **kwargs)


def measured(costs, **kwargs) -> Controller:
    controller = Controller(**kwargs)
    for _ in range(TRUSTED_SAMPLES):
        for batch, seconds in costs.items():
            controller.costs.record_pass(batch, seconds)
    return controller


def teach(controller, source, match_len, acceptance, rounds=40, k=8):
    """Rounds whose accepted run is the mean of a geometric law with this per-token acceptance: a model
    drafter's drafts, or a copy drafter's offers of ``k`` tokens, judged by what the round emitted."""
    accepted = k if acceptance >= 1 else min(k, int(acceptance / (1 - acceptance)))
    for _ in range(rounds):
        if source in COPIES:
            offer = copy_offer(source, k, match_len)
            controller.plan([offer])
            controller.record_round(source, k, accepted, offer.tokens[:accepted] + [NOT_OFFERED])
        else:
            controller.record_round(source, k, accepted)


def offer_short_copies(controller, right_in_ten, rounds=60):
    """Rounds kept to the target alone whose one-token lookup offers of 2-token matches were judged right
    ``right_in_ten`` times in ten by what the round emitted."""
    for i in range(rounds):
        offer = copy_offer("lookup", 1, 2)
        controller.plan([offer])
        controller.record_round("none", 0, 0, offer.tokens if i % 10 < right_in_ten else [NOT_OFFERED])


COPIES = ("lookup", "suffix")
NOT_OFFERED = -1  # a token no copy offers


def copy_offer(source, available, match_len):
    return Offer(source, available, match_len, list(range(100, 100 + available)))


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens([0.0] * 5) == [1.0] * 6
    assert expected_tokens([1.0] * 5)[5] == 6.0
    assert expected_tokens([0.5, 0.5]) == pytest.approx([1.0, 1.5, 1.75])
    assert expected_tokens([0.9, 0.5, 1.0]) == pytest.approx([1.0, 1.9, 2.35, 2.8])


@pytest.mark.parametrize("method", ["auto", "lookup"])
def test_plain_steps_come_first_so_every_choice_has_a_price(method):
    controller = Controller(method)
    controller.costs.record_prefill(300, 2.0, SHARE)  # a large prefill alone does not price a one-token step
    for _ in range(TRUSTED_SAMPLES):
        assert choose(controller, lookup_available=10, lookup_match_len=8).source == "none"
        controller.costs.record_pass(1, 0.04)
    assert choose(controller, lookup_available=10, lookup_match_len=8).source == "lookup"


def test_a_measured_large_pass_makes_long_copies_pay():
    """Linear small-batch costs alone cap the draft; a cheap large pass (tiled kernels) lifts the cap."""
    small = {1: 0.043, 2: 0.064, 3: 0.080, 4: 0.100}
    controller = measured(small, method="lookup")
    teach(controller, "lookup", 32, 0.95, k=20)
    short = choose(controller, lookup_available=64, lookup_match_len=32)
    controller.costs.record_prefill(268, 2.1, SHARE)
    long = choose(controller, lookup_available=64, lookup_match_len=32)
    assert long.k > 2 * short.k and long.expected_rate > short.expected_rate


def test_each_lookup_draft_position_is_credited_to_the_match_it_continues():
    controller = Controller("auto")
    before = {m: controller.acceptance("lookup", m) for m in (4, 8, 16)}
    # After a 6-token match, tokens 1-2 continue matches of 6-7, tokens 3-10 of 8-15; the 11th was refused.
    for _ in range(5):
        offer = copy_offer("lookup", 12, 6)
        controller.plan([offer])
        controller.record_round("lookup", 12, 10, offer.tokens[:10] + [NOT_OFFERED])
    assert controller.acceptance("lookup", 4) > before[4]  # only accepted there
    assert controller.acceptance("lookup", 8) > before[8]
    assert controller.acceptance("lookup", 16) < before[16]  # the refusal, at a match of 16
    # A copy that has run far is expected to run on: the plan drafts past the bucket it started in.
    controller = measured(CPU, method="auto")
    teach(controller, "lookup", 16, 0.99, k=32)
    assert choose(controller, lookup_available=64, lookup_match_len=8).k > 8


def test_cpu_costs_with_a_poor_lookup_do_not_speculate():
    controller = measured(CPU, method="auto")
    teach(controller, "lookup", 1, 0.1)
    assert choose(controller, lookup_available=64, lookup_match_len=1).source == "none"


def test_a_long_reliable_match_drafts_long():
    controller = measured(CPU, method="auto")
    teach(controller, "lookup", 4, 0.95)
    plan = choose(controller, lookup_available=64, lookup_match_len=4)
    assert plan.source == "lookup" and plan.k >= 8
    assert plan.expected_rate > 1.5 / CPU[1]


def test_draft_model_loses_on_cpu_and_wins_on_gpu():
    cpu = measured(CPU, method="auto", has_draft_model=True, draft_cost_ratio=0.57)
    teach(cpu, "draft", 1, 0.75)
    assert choose(cpu, lookup_available=0, lookup_match_len=0).source == "none"
    gpu = measured(GPU, method="auto", has_draft_model=True, draft_cost_ratio=0.15)
    teach(gpu, "draft", 1, 0.75)
    plan = choose(gpu, lookup_available=0, lookup_match_len=0)
    assert plan.source == "draft" and plan.k >= 3


def test_a_draft_model_that_cannot_pay_is_priced_again_when_the_pass_curve_changes_or_after_a_while():
    """Unused, its acceptance and step cost stay as they were: it is priced again as soon as a pass of
    several tokens is measured (here verifications turn out nearly free), and else after REPRICE_ROUNDS
    (here the machine slows the target, not the measured draft step)."""
    controller = measured(CPU, method="auto", has_draft_model=True, draft_cost_ratio=0.57)
    teach(controller, "draft", 1, 0.75)
    assert choose(controller).source == "none"
    for _ in range(COST_WINDOW):
        for batch, seconds in GPU.items():
            controller.costs.record_pass(batch, seconds * CPU[1] / GPU[1])
    assert choose(controller).source == "draft"

    controller = measured(CPU, method="auto", has_draft_model=True, draft_cost_ratio=0.57)
    teach(controller, "draft", 1, 0.75)
    controller.record_draft("draft", 0, 0.0, 4, 4 * CPU[1] * 0.57)
    assert choose(controller).source == "none"
    for _ in range(COST_WINDOW):
        controller.costs.record_pass(1, CPU[1] * 3)
    plans = [choose(controller).source for _ in range(REPRICE_ROUNDS)]
    assert plans == ["none"] * (REPRICE_ROUNDS - 1) + ["draft"]


def test_measured_draft_step_cost_overrides_the_prior():
    controller = measured(GPU, method="auto", has_draft_model=True, draft_cost_ratio=0.15)
    teach(controller, "draft", 1, 0.75)
    for _ in range(5):
        # the draft turned out slower than the target
        controller.record_draft("draft", 0, 0.0, 4, 4 * 0.030)
    assert choose(controller, lookup_available=0, lookup_match_len=0).source == "none"


def test_one_slow_pass_does_not_write_off_a_batch_size():
    controller = measured(CPU, method="auto")
    teach(controller, "lookup", 4, 0.95)
    for _ in range(3):
        controller.costs.record_pass(17, 0.240)
    controller.costs.record_pass(17, 30.0)  # another process stole the CPU for this one
    assert controller.costs.pass_cost(17) < 0.3


def test_one_slow_round_does_not_make_drafting_look_cheap():
    """A round's own work is the median of the last few. One round that met a full garbage collection (46 ms
    on SmolLM2-135M, AMD EPYC) must not price the next rounds as dear: a dear round favours drafting, whose
    tokens share it."""
    controller = measured(CPU, method="auto")
    offer_short_copies(controller, right_in_ten=4)  # just short of paying
    for _ in range(COST_WINDOW):
        controller.overheads.record(0.0003, drafted=False)
    assert choose(controller, lookup_available=1, lookup_match_len=2).source == "none"
    controller.overheads.record(0.046, drafted=False)
    assert choose(controller, lookup_available=1, lookup_match_len=2).source == "none"


def test_a_drafting_rounds_own_work_is_priced_apart_from_a_target_alone_rounds():
    """Offering, verifying several rows' logits and rolling back make a drafting round's own work dearer
    than a target-alone round's; priced at the blended figure, a bet that loses beside the target alone
    looks like a win."""
    controller = measured(CPU, method="auto")
    offer_short_copies(controller, right_in_ten=7)  # a thin edge
    for _ in range(COST_WINDOW):
        controller.overheads.record(0.0002, drafted=False)
    plan = choose(controller, lookup_available=1, lookup_match_len=2)
    assert (plan.source, plan.explored) == ("lookup", False)
    for _ in range(COST_WINDOW):  # each drafting round's own work costs a fifth of a pass more
        controller.overheads.record(0.0002 + CPU[1] / 5, drafted=True)
    assert choose(controller, lookup_available=1, lookup_match_len=2).source == "none"
    assert controller.beliefs()["drafting_overhead_s"] > controller.beliefs()["overhead_s"]


def test_one_slow_draft_or_snapshot_does_not_move_its_cost():
    """A draft model's steps and catch-up, and a recurrent target's checkpoints and restores, are the median
    of their last few measurements as passes are: one slowed by another process is not charged to the
    rounds after it."""
    controller = measured(GPU, method="auto", has_draft_model=True, draft_cost_ratio=0.15)
    replay = controller.costs.pass_cost(3)
    for _ in range(3):
        controller.record_draft("draft", 100, 100 * 0.001, 4, 4 * 0.003)
        controller.costs.record_checkpoint(0.002)
        controller.costs.record_restore(0.004 + replay, 3)
    controller.record_draft("draft", 100, 100 * 0.1, 4, 4 * 0.3)
    controller.costs.record_checkpoint(0.2)
    controller.costs.record_restore(0.4 + replay, 3)
    beliefs = controller.beliefs()
    assert beliefs["draft_step_s"] == pytest.approx(0.003)
    assert beliefs["draft_catch_up_s_per_token"] == pytest.approx(0.001)
    assert (beliefs["checkpoint_s"], beliefs["restore_s"]) == pytest.approx((0.002, 0.004))


def test_written_off_option_is_retried_after_a_while():
    controller = measured(CPU, method="auto")
    teach(controller, "lookup", 4, 0.0, rounds=10)
    assert choose(controller, lookup_available=8, lookup_match_len=4).source == "none"
    for _ in range(300):
        controller.record_round("none", 0, 0)
    assert choose(controller, lookup_available=8, lookup_match_len=4).source == "lookup"


def test_on_a_gpu_even_a_poor_lookup_pays():
    """Verification is nearly free there, so a 10% acceptance is still worth a draft."""
    controller = measured(GPU, method="auto")
    for i in range(50):
        offer = copy_offer("lookup", 8, 1)
        controller.plan([offer])
        accepted = int(i % 10 == 5)
        controller.record_round("lookup", 8, accepted, offer.tokens[:accepted] + [NOT_OFFERED])
    assert controller.acceptance("lookup", 1) == pytest.approx(0.1, abs=0.02)
    plan = choose(controller, lookup_available=8, lookup_match_len=1)
    assert (plan.source, plan.explored) == ("lookup", False)


def test_the_one_token_passes_after_a_larger_one_price_the_return_to_them():
    """What the RETURN_PASSES one-token passes after a larger pass take beyond the one-token pass before it
    is the return's cost; a return cut short by another larger pass starts again, one a prompt interrupts
    is dropped. The slower passes stay one-token samples."""
    controller = measured(CPU)
    costs, one = controller.costs, CPU[1]
    slower = [0.012, 0.006, 0.004] + [0.002] * (RETURN_PASSES - 3)

    def steady():
        for _ in range(COST_WINDOW):
            costs.record_pass(1, one)

    steady()
    costs.record_pass(3, CPU[3])
    for extra in slower[:2]:
        costs.record_pass(1, one + extra)
    costs.record_pass(5, CPU[5])  # cut short: nothing priced yet
    costs.prompt_evaluated()
    for extra in slower:
        costs.record_pass(1, one + extra)  # they follow the prompt: nothing priced either
    assert costs.return_s == 0.0 and costs.one > one  # they were one-token samples
    for _ in range(2):
        steady()
        costs.record_pass(3, CPU[3])
        for extra in slower:
            costs.record_pass(1, one + extra)
        assert costs.return_s == pytest.approx(sum(slower))


def test_a_bet_that_pays_on_its_pass_alone_is_refused_when_the_return_to_one_token_passes_eats_its_edge():
    """Offers right 7 times in 10 beat this curve's 0.55 on the pass alone; with a return of a third of a
    pass measured, a one-token bet after one-token passes no longer pays, while one right after a larger
    pass (the return is paid whatever this round does) still does."""
    controller = measured(CPU, method="auto")
    offer_short_copies(controller, right_in_ten=7, rounds=30)
    assert choose(controller, lookup_available=1, lookup_match_len=2).source == "lookup"
    for _ in range(COST_WINDOW):  # isolated bets, each after a run of one-token passes
        for _ in range(COST_WINDOW):
            controller.costs.record_pass(1, CPU[1])
        controller.costs.record_pass(2, CPU[2])
        for _ in range(RETURN_PASSES):
            controller.costs.record_pass(1, CPU[1] + CPU[1] / 3 / RETURN_PASSES)
    assert controller.beliefs()["return_s"] == pytest.approx(CPU[1] / 3, rel=0.2)
    assert choose(controller, lookup_available=1, lookup_match_len=2, last_rows=1).source == "none"
    assert choose(controller, lookup_available=1, lookup_match_len=2, last_rows=2).source == "lookup"


def test_a_one_token_bet_the_estimate_says_pays_is_made_however_few_offers_it_rests_on():
    """Offers right 7 times in 10: after 10 of them the estimate (0.60) beats the 0.55 this curve needs to
    break even, and auto bets on it as it does after 30 (not as a probe): a one-token bet stakes one row."""
    for rounds in (10, 30):
        controller = measured(CPU, method="auto")
        offer_short_copies(controller, right_in_ten=7, rounds=rounds)
        assert controller.acceptance("lookup", 2) > 0.58
        plan = choose(controller, lookup_available=1, lookup_match_len=2)
        assert (plan.source, plan.k, plan.explored) == ("lookup", 1, False)


def test_a_long_bet_within_what_its_estimates_are_unsure_of_is_cut_to_one_token():
    """A curve as steep as SmolLM2's from one row to two, flat after: 3-token matches judged right 6 times
    in 10 make a 3-token draft the best bet at the estimate, but not with it half a standard deviation
    lower after 10 offers (one token still pays there); after 40 the same bet is sure and is made whole."""
    steep = {1: 0.010, 2: 0.0150, 3: 0.0170, 4: 0.0190, 5: 0.0210, 8: 0.027, 9: 0.029, 16: 0.043, 17: 0.045}
    for rounds, k in ((10, 1), (40, 3)):
        controller = measured(steep, method="auto")
        for i in range(rounds):
            offer = copy_offer("lookup", 1, 3)
            controller.plan([offer])
            controller.record_round("none", 0, 0, offer.tokens if i % 10 < 6 else [NOT_OFFERED])
        plan = choose(controller, lookup_available=8, lookup_match_len=3)
        assert (plan.source, plan.k, plan.explored) == ("lookup", k, False)


def test_fixed_methods_and_lengths():
    controller = measured(CPU, method="lookup", draft_len=5)
    # A fixed length is taken whatever the match: no pricing.
    assert {choose(controller, lookup_available=64, lookup_match_len=m).k for m in (1, 4, 32)} == {5}
    assert choose(controller, lookup_available=64, lookup_match_len=1).k == 5
    assert choose(controller, lookup_available=0, lookup_match_len=0).source == "none"
    hybrid = measured(CPU, method="hybrid", draft_len=3, has_draft_model=True)
    assert choose(hybrid, lookup_available=0, lookup_match_len=0).source == "draft"
    assert choose(hybrid, lookup_available=2, lookup_match_len=3).source == "lookup"
    assert choose(measured(CPU, method="none"), lookup_available=64, lookup_match_len=4).source == "none"


def test_configure_errors_name_the_fix():
    with pytest.raises(UsageError, match="method hybrid needs a draft model: pass --draft PATH"):
        Controller("hybrid", missing={"draft": "pass --draft PATH or use --profile"})
    with pytest.raises(UsageError, match="unknown method"):
        Controller("fastest")
    controller = Controller("auto")
    with pytest.raises(UsageError, match="between 1 and"):
        controller.configure("lookup", 0)
    # a longer verification would leave the batch sizes the exact kernels keep invariant
    controller.configure("lookup", MAX_DRAFT_LEN)
    with pytest.raises(UsageError, match=f"between 1 and {MAX_DRAFT_LEN}"):
        controller.configure("lookup", MAX_DRAFT_LEN + 1)


def test_extrapolation_follows_the_measured_slope():
    """A CPU where each extra token costs most of a pass must not be assumed as cheap as the prior says."""
    controller = measured({1: 0.040, 9: 0.210}, method="auto")
    assert controller.costs.pass_cost(17) == pytest.approx(0.210 + (0.210 - 0.040) / 8 * 8)
    assert controller.costs.pass_cost(5) == pytest.approx(0.040 + 0.5 * 0.170)
    # One step from one token to two is the steepest part of a CPU's curve: it does not set the slope.
    steep = measured({1: 0.040, 2: 0.080}, method="auto")
    assert steep.costs.pass_cost(10) == pytest.approx(0.080 + PRIOR_BATCH_SLOPE * 0.040 * 8)


def test_a_long_match_is_judged_no_better_than_the_evidence_below_it():
    """Matches of 16+ are judged only when a copy runs that far; where 8-15 copy far worse than the prior
    said, a 16-match is not priced at its prior, and a 12-match does not bet a long pass on it."""
    priced = measured(CPU, method="auto")
    assert priced.acceptance("lookup", 16) == pytest.approx(0.95)
    teach(priced, "lookup", 8, 0.5, k=4)  # rounds end inside the 8-15 bucket
    assert priced.acceptance("lookup", 16) < 0.9
    assert priced.acceptance("lookup", 32) < 0.98
    assert choose(priced, lookup_available=64, lookup_match_len=12).k <= 8
    # evidence that short matches copy better never raises the long ones above their prior
    better = measured(CPU, method="auto")
    teach(better, "lookup", 8, 0.99, k=4)
    assert better.acceptance("lookup", 16) == pytest.approx(0.95)


def test_what_earlier_answers_taught_a_copy_estimate_weighs_as_the_prior_in_a_new_one():
    """An answer whose copies ran 40 tokens every time, then one whose long matches break at once: after
    three refusals in the new answer the estimate has left 'certain' behind."""
    controller = measured(CPU, method="auto")
    teach(controller, "lookup", 32, 1.0, rounds=60, k=32)
    assert controller.acceptance("lookup", 32) > 0.99
    controller.begin_answer()
    assert controller.acceptance("lookup", 32) > 0.985  # what was learnt is kept
    teach(controller, "lookup", 32, 0.0, rounds=3, k=32)
    assert controller.acceptance("lookup", 32) < 0.75


def test_a_copy_in_progress_is_its_own_bucket():
    controller = measured(CPU, method="auto")
    teach(controller, "lookup", 4, 0.2)
    teach(controller, "lookup", 12, 0.95)
    assert controller.acceptance("lookup", 5) < 0.5 < controller.acceptance("lookup", 9)
    assert choose(controller, lookup_available=64, lookup_match_len=12).source == "lookup"


def test_a_prefill_hints_at_long_drafts_but_is_no_measurement():
    """A 64-token prompt pass computed one row of logits, a 64-token verification computes 64: priced as
    one, the rows' output projection is added back; it prices only sizes not measured above it, and is
    never remembered as a verification of its size."""
    controller = measured({1: 0.040, 2: 0.060, 4: 0.100}, method="auto")
    controller.costs.record_prefill(64, 1.0, SHARE)
    assert controller.costs.pass_cost(64) == pytest.approx(1.0 * 64 / (64 * (1 - SHARE) + SHARE))
    assert 0.100 < controller.costs.pass_cost(32) < controller.costs.pass_cost(64)
    assert 64 not in controller.costs.relative_costs()
    for _ in range(TRUSTED_SAMPLES):
        controller.costs.record_pass(64, 1.6)
    assert controller.costs.pass_cost(64) == pytest.approx(1.6)
    assert controller.costs.relative_costs()[64] == pytest.approx(40.0)


def test_a_short_answer_does_not_start_with_probes_at_a_loss():
    """With only a one-token pass and a prefill measured, small batches are priced at the prior slope
    (not on the line to the cheap-per-token prefill), so a chance short match is not drafted."""
    controller = measured({1: 0.037}, method="auto")
    controller.costs.record_prefill(300, 2.0, SHARE)
    assert controller.costs.pass_cost(2) == pytest.approx(0.037 * (1 + PRIOR_BATCH_SLOPE))
    assert choose(controller, lookup_available=8, lookup_match_len=1).source == "none"
    assert choose(controller, lookup_available=8, lookup_match_len=2).source == "none"
    # Far from measured sizes the estimate heads for the prefill's cost, so a long copy may still be tried.
    assert controller.costs.pass_cost(64) < 0.037 * (1 + PRIOR_BATCH_SLOPE * 63)


def test_a_draft_catch_up_must_be_repaid_within_the_answer():
    """A draft that pays per token in steady state is still not worth a long catch-up near the end."""
    controller = measured(GPU, method="auto", has_draft_model=True, draft_cost_ratio=0.15)
    teach(controller, "draft", 1, 0.8)
    in_step = choose(controller, lookup_available=0, lookup_match_len=0, draft_catch_up=lambda: 2, remaining=4)
    assert in_step.source == "draft"
    behind = dict(lookup_available=0, lookup_match_len=0, draft_catch_up=lambda: 2000)
    assert choose(controller, **behind, generated=10, remaining=10).source == "none"
    assert "catching up on 2000 tokens" in controller.draft_status()
    assert choose(controller, **behind, generated=3000, remaining=5000).source == "draft"


def test_a_draft_that_cannot_pay_is_off_for_the_session():
    controller = measured(GPU, method="auto", has_draft_model=True, draft_cost_ratio=0.15)
    assert choose(controller, lookup_available=0, lookup_match_len=0).source == "draft"  # by its priors
    controller.record_draft("draft", 300, 0.3, 4, 4 * 0.030)
    controller.record_round("draft", 4, 4)
    assert controller.draft_status().startswith("off for this session")
    assert controller.draft_status().startswith("off for this session: a draft step costs 1.49 of a target step")
    teach(controller, "draft", 1, 1.0)  # even perfect acceptance later does not bring it back
    assert choose(controller, lookup_available=0, lookup_match_len=0, generated=10**6).source == "none"


def test_an_unused_draft_keeps_its_acceptance_estimate():
    """Trying the draft again costs a catch-up, so its estimate does not drift back to the prior."""
    controller = measured(GPU, method="auto", has_draft_model=True, draft_cost_ratio=0.15)
    teach(controller, "draft", 1, 0.1, rounds=10)
    low = controller.acceptance("draft")
    for _ in range(300):
        controller.record_round("none", 0, 0)
    assert controller.acceptance("draft") == low
    assert choose(controller, lookup_available=0, lookup_match_len=0).source == "none"


def test_a_slow_spell_leaves_no_stale_costs():
    """Passes are kept relative to the one-token pass of their time: once another process stops slowing
    the machine, sizes measured during the spell are not priced at its absolute times."""
    controller = measured({b: 10 * s for b, s in CPU.items()}, method="auto")
    teach(controller, "lookup", 4, 0.95)
    for _ in range(COST_WINDOW):
        controller.record_round("none", 0, 0)
        controller.costs.record_pass(1, CPU[1])
    assert controller.costs.pass_cost(9) == pytest.approx(CPU[9])
    assert choose(controller, lookup_available=64, lookup_match_len=4).source == "lookup"


def test_passes_timed_while_costs_are_held_price_nothing_until_the_hold_ends():
    """Two controllers sharing costs and taking a round each in turn price the turn's rounds alike."""
    first = measured(CPU, method="lookup")
    second = Controller("auto", costs=first.costs)
    before = first.costs.pass_cost(9)
    with first.costs.held():
        for _ in range(COST_WINDOW):
            first.costs.record_pass(9, 3 * CPU[9])
        assert second.costs.pass_cost(9) == before
    assert second.costs.pass_cost(9) == pytest.approx(3 * CPU[9])


def test_remembered_costs_let_the_first_long_copy_take_the_length_that_pays():
    """A curve measured in an earlier session (a 32-token pass costing little more than a 16-token one,
    as llama.cpp switches kernels) sets the draft length at once; a controller that has measured only
    the small batches extrapolates their slope and drafts shorter."""
    curve = {1: 0.070, 2: 0.073, 4: 0.109, 8: 0.175, 16: 0.316, 32: 0.385, 64: 0.635}
    fresh = measured({b: s for b, s in curve.items() if b <= 16}, method="lookup")
    remembering = Controller("lookup")
    remembering.remember({b: seconds / curve[1] for b, seconds in curve.items()})
    for _ in range(TRUSTED_SAMPLES):
        remembering.costs.record_pass(1, curve[1])
    assert remembering.costs.pass_cost(32) == pytest.approx(curve[32])
    for controller in (fresh, remembering):
        for match_len in (8, 16, 32):
            teach(controller, "lookup", match_len, 0.95, k=32)
    guessed = choose(fresh, lookup_available=64, lookup_match_len=8)
    known = choose(remembering, lookup_available=64, lookup_match_len=8)
    assert guessed.k < 16 and known.k >= 31
    # What it measures goes back to memory; the one-token pass and a prefill-sized pass do not.
    remembering.costs.record_pass(300, 2.0)
    remembering.costs.record_prefill(48, 0.3, SHARE)
    assert remembering.costs.relative_costs() == pytest.approx({b: s / curve[1] for b, s in curve.items() if b > 1})


def test_a_stale_remembered_cost_is_outvoted_by_this_sessions_passes():
    controller = measured({1: 0.05}, method="auto")
    controller.remember({8: 1.2, 1: 7.0, 500: 3.0})  # a one-token or prefill-sized entry is ignored
    assert controller.costs.pass_cost(8) == pytest.approx(0.06)
    assert set(controller.costs.relative_costs()) == {8}
    for _ in range(TRUSTED_SAMPLES + 1):
        controller.costs.record_pass(8, 0.15)
    assert controller.costs.pass_cost(8) == pytest.approx(0.15)
    assert controller.costs.pass_cost(1) == pytest.approx(0.05)


def test_a_remembered_cost_yields_to_this_sessions_second_pass_and_is_written_back_only_once_measured():
    # The 2-core Intel Xeon's remembered 2-token pass said 1.30x of a one-token pass; it took 1.03x.
    controller = measured({1: 0.05}, method="auto")
    controller.remember({2: 1.30, 8: 3.0})
    assert controller.costs.pass_cost(2) == pytest.approx(0.065)  # trusted before any pass of its size
    for _ in range(2):
        controller.costs.record_pass(2, 0.0515)
    assert controller.costs.pass_cost(2) == pytest.approx(0.0515)
    assert controller.costs.measured_costs() == {}  # two passes are not yet a measurement to keep
    controller.costs.record_pass(2, 0.0515)
    # This session's own passes alone, and not the size it only remembered.
    assert controller.costs.measured_costs() == pytest.approx({2: 1.03})
    assert controller.costs.relative_costs() == pytest.approx({2: 1.03, 8: 3.0})


def test_a_short_pass_remembered_above_a_longer_one_is_measured_again_and_then_drafted_where_it_pays():
    """Seen on the 2-core Intel Xeon: pass-costs.json said a 2-token pass costs 3.0 one-token passes and a
    3-token one 2.0, above a 4-token pass's 1.56 (taken while another process ran); a 2-token pass costs
    1.05. Priced at a loss, a one-token draft was never made, so never measured again. Left out as stale,
    it is estimated, probed and measured, and from then on short copies right 30% of the time are drafted
    (1.3 tokens for 1.05 passes) and its cost goes back to memory."""
    one, truth = 0.070, {1: 0.070, 2: 0.0735, 3: 0.085, 4: 0.109, 5: 0.125}
    controller = measured({1: one}, method="auto")
    controller.remember({2: 3.0, 3: 2.0, 4: 1.56})
    assert controller.costs.relative_costs() == {4: 1.56}
    assert controller.costs.pass_cost(2) == pytest.approx(one * (1 + PRIOR_BATCH_SLOPE))
    plans, spent, tokens = [], 0.0, 0
    for i in range(300):
        if i % 100 == 0:
            controller.begin_answer()
        offer = copy_offer("lookup", 4, 2)
        plan = controller.plan([offer])
        plans.append(plan)
        right = i % 10 < 3  # only ever the first copied token
        accepted = min(plan.k, int(right))
        controller.costs.record_pass(plan.k + 1, truth[plan.k + 1])
        spent += truth[plan.k + 1]
        tokens += accepted + 1
        controller.record_round(plan.source, plan.k, accepted, offer.tokens[:1] + [NOT_OFFERED] if right else [NOT_OFFERED])
    assert controller.costs.pass_cost(2) == pytest.approx(truth[2])
    assert controller.costs.measured_costs()[2] == pytest.approx(truth[2] / one)  # and remembered so
    assert sum(p.k == 1 for p in plans[-100:]) > 90
    assert tokens / spent > 1.15 / one  # the session as a whole ran well ahead of the target alone


def test_remembered_costs_need_no_one_token_pass_to_report():
    """A fixed draft length never times a one-token pass, so remembered sizes have no absolute price."""
    controller = Controller("lookup", draft_len=2)
    controller.remember({3: 1.3, 16: 3.0})
    controller.costs.record_pass(3, 0.09)
    assert choose(controller, lookup_available=5, lookup_match_len=2).k == 2
    assert controller.beliefs()["pass_s"] == {}
    assert controller.costs.relative_costs() == {3: 1.3, 16: 3.0}


def test_loading_the_draft_is_charged_to_its_first_use():
    """A short answer does not pay for loading a draft model; a long one may, and once it is loaded only
    the catch-up is charged."""
    controller = measured(GPU, method="auto", has_draft_model=True, draft_cost_ratio=0.15, draft_load_s=0.5)
    in_step = dict(lookup_available=0, lookup_match_len=0, draft_catch_up=lambda: 2)
    assert choose(controller, **in_step, generated=0, remaining=96).source == "none"
    assert controller.draft_status().startswith("not used: loading it and catching up on 2 tokens would cost 0.50 s")
    assert choose(controller, **in_step, generated=2000, remaining=4000).source == "draft"
    controller.record_draft("draft", 0, 0.0, 1, 0.003)
    assert choose(controller, **in_step, generated=0, remaining=96).source == "draft"


def test_a_recurrent_target_prices_drafts_past_its_snapshots():
    """Past the snapshots a draft pays a checkpoint, and on a rejection a restore and a replay pass: dear
    ones keep drafts inside the window, cheap ones let a sure copy run on."""
    def plan(checkpoint_s, restore_s, window=4):
        controller = measured(GPU, method="lookup", rollback_window=window)
        teach(controller, "lookup", 32, 0.97, k=8)
        controller.costs.record_checkpoint(checkpoint_s)
        controller.costs.record_restore(restore_s + controller.costs.pass_cost(3), 3)
        return choose(controller, lookup_available=32, lookup_match_len=32)

    assert plan(checkpoint_s=0.2, restore_s=0.2).k <= 4
    assert plan(checkpoint_s=0.0001, restore_s=0.0001).k > 4
    # A KV cache (no window) needs no checkpoint at all, whatever one would cost.
    assert plan(checkpoint_s=0.2, restore_s=0.2, window=None).k > 4


def test_a_target_that_cannot_roll_back_never_speculates_and_says_why():
    controller = measured(CPU, method="auto", has_draft_model=True, speculation_off="no checkpoint")
    teach(controller, "lookup", 32, 0.99)
    assert choose(controller, lookup_available=32, lookup_match_len=32).source == "none"
    assert "no checkpoint" in controller.draft_status()


def test_suffix_drafts_are_priced_by_their_own_acceptance_and_only_in_auto():
    controller = measured(CPU, method="auto")
    teach(controller, "lookup", 4, 0.2)
    teach(controller, "suffix", 8, 0.95)
    # Earlier answers predict this one better than the context does: auto drafts from them.
    plan = choose(controller, lookup_available=64, lookup_match_len=4, suffix_available=64, suffix_match_len=8)
    assert plan.source == "suffix" and plan.k >= 8
    # The same match in the context's estimate was not touched by the suffix rounds, and vice versa.
    assert controller.acceptance("lookup", 8) < 0.9 < controller.acceptance("suffix", 8)
    assert controller.beliefs()["suffix_acceptance"][8] == round(controller.acceptance("suffix", 8), 3)
    # A history that keeps failing is left alone.
    teach(controller, "suffix", 8, 0.05, rounds=200)
    only_history = {"lookup_available": 0, "lookup_match_len": 0, "suffix_available": 64, "suffix_match_len": 8}
    assert choose(controller, **only_history).source == "none"
    # Fixed methods never draft from the history.
    lookup = measured(CPU, method="lookup")
    teach(lookup, "suffix", 8, 0.99)
    assert choose(lookup, **only_history).source == "none"


def test_offers_not_drafted_from_are_judged_by_what_the_target_emitted():
    """Short matches are priced as a loss by their priors; where the text copies well, the rounds that
    kept to the target show it (each emitted what the offer held), so lookup is drafted from in earnest
    after a few such rounds, before any probe."""
    controller = measured(CPU, method="auto")
    plans = []
    for _ in range(30):
        offer = copy_offer("lookup", 8, 2)
        plan = controller.plan([offer])
        plans.append(plan)
        controller.record_round(plan.source, plan.k, plan.k, offer.tokens[: plan.k + 1])  # the copy was right
    assert plans[0].source == "none"
    assert all(p.source == "lookup" for p in plans[-10:])
    assert not any(p.explored for p in plans)
    assert controller.acceptance("lookup", 2) > 0.8


def test_exploring_a_drafter_that_does_not_pay_costs_a_bounded_share():
    """Right 45% of the time, a one-token copy loses here (a two-token pass costs 1.55 of a one-token
    one) but its hopeful rate would pay: it is probed again and again, within the budget."""
    controller = measured(CPU, method="auto")
    rounds = 2000
    for i in range(rounds):
        offer = copy_offer("lookup", 8, 2)
        plan = controller.plan([offer])
        right = i % 20 < 9
        accepted = min(plan.k, int(right))  # only ever the first token is right
        emitted = offer.tokens[:1] + [NOT_OFFERED] * bool(plan.k) if right else [NOT_OFFERED]
        controller.record_round(plan.source, plan.k, accepted, emitted)
    beliefs = controller.beliefs()
    assert beliefs["explored_rounds"] > 10
    target_alone_s = rounds * CPU[1]  # about one token per round
    assert 0 < beliefs["exploration_loss_s"] <= EXPLORE_SHARE * target_alone_s + CPU[9]  # give or take one probe
    assert controller.acceptance("lookup", 2) == pytest.approx(0.45, abs=0.1)


@pytest.mark.parametrize("costs, drafts", [(GPU, True), (CPU, False)])
def test_under_sampling_a_copy_is_judged_at_its_acceptance_probability_drafted_or_not(costs, drafts):
    """A copied token x is accepted with probability p(x) (the acceptance rule with a point-mass draft),
    and the target alone emits x with that same probability: the estimate comes to p(x) either way."""
    rng = np.random.default_rng(7)
    p = np.array([0.3, 0.5, 0.2])  # the target's distribution at every position; the copy offers token 0
    controller = measured(costs, method="auto")
    estimates, drafted = [], 0
    for _ in range(3000):
        offer = Offer("lookup", 1, 2, [0])
        plan = controller.plan([offer])
        if plan.k:
            accepted, token = verify_sampled([0], None, [p, p], rng)
            emitted = [0] * accepted + [token]
        else:
            accepted, emitted = 0, [sample(p, rng)]
        drafted += plan.k
        controller.record_round(plan.source, plan.k, accepted, emitted)
        estimates.append(controller.acceptance("lookup", 2))
    assert (drafted > 2500) == drafts  # a GPU drafts nearly every round, a CPU nearly never
    assert np.mean(estimates[500:]) == pytest.approx(0.3, abs=0.02)
