"""MTP drafting at Qwen3.5-0.8B's shapes: speed against the target alone as a function of acceptance,
and side by side with stock llama.cpp's ``--spec-type draft-mtp`` on the same files.

Real weights cannot be fetched here, so acceptance is made, not found. Every model is Qwen3.5-0.8B's
shapes (scripts/make_hybrid_model.py) plus one MTP block, seeded random:

- ``agree-S``: a head that predicts what a bigram model would, beside a trunk whose layers are scaled by
  S (tests/tiny_models.py: ``mtp_agrees``, ``trunk_scale``). At S = 0 the target is that bigram model and
  every greedy draft is accepted; larger S makes the target lean on its context and the head miss more.
- ``random``: a seeded-random head, which nearly never agrees (the cost of drafting for nothing).

A pass costs what its shapes and tensor types cost, not what its values are (zeroed projections are
multiplied all the same), so the costs are the real model's. Two figures come out:

1. Measured costs (the engine's own: pass per batch size, head step, checkpoint and restore of the hybrid
   state, per-round overhead, read from the controller after MTP rounds on ``agree-0.3``) put through the
   planner's own expected-value function: speed against the target alone at first-token acceptance
   0.5-0.9 (each later draft position accepted at the same rate: an assumption, said in the output), the
   best draft length at each, the break-even acceptance, and the head step's share of a pass with and
   without its output projection.
2. ``localspec bench --vs-llama-cpp BIN`` on every model: stock llama-completion, stock draft-mtp and
   localspec none / mtp / auto, interleaved, greedy, with the acceptance each reached.

Run it alone on the machine (every timing is contaminated by other processes):

    python scripts/bench_mtp.py /tmp/mtp-bench --bin "$(scripts/build-llama-cpp-stock --cached)"
    python scripts/bench_mtp.py /tmp/mtp-bench --quick          # a smoke run: a small model, costs only
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from localspec.bench.stock import overall_rows  # noqa: E402
from scripts.make_hybrid_model import QUANT_TYPES, make_hybrid_model, qwen35_0_8b_spec  # noqa: E402

ACCEPTANCES = (0.5, 0.6, 0.7, 0.8, 0.9)
COST_MODEL = "agree-0.3"
COST_DRAFT_LENS = (1, 2, 3, 4, 6, 8)
PROMPT = "def parse(line):\n    fields = line.split(',')\n    return [f.strip() for f in fields]\n" * 6


def write_models(out: Path, scales: list[float], *, layers: int, embd: int, vocab: int, quant: str | None) -> dict:
    """name -> path, written once (an existing file is kept)."""
    base = replace(qwen35_0_8b_spec(layers=layers, embd=embd, vocab=vocab), mtp=True)
    specs = {f"agree-{s:g}": replace(base, mtp_agrees=True, trunk_scale=s) for s in scales}
    specs["random"] = base
    models = {}
    for name, spec in specs.items():
        path = out / f"qwen35-{layers}x{embd}-mtp-{name}-{quant or 'f16'}.gguf"
        if not path.exists():
            print(f"writing {path}", file=sys.stderr)
            make_hybrid_model(path, spec, quant_type=quant)
        models[name] = path
    return models


def measure_costs(path: Path, *, threads: int, max_tokens: int) -> dict:
    """The controller's measured costs after MTP rounds of several draft lengths on ``path``."""
    from localspec.engine.backend import LlamaModel
    from localspec.engine.decoder import SpeculativeDecoder
    from localspec.engine.drafting import Source

    target = LlamaModel(path, n_ctx=4096, n_threads=threads, load_mtp=True)
    decoder = SpeculativeDecoder(target, method="mtp")
    decoder.drafter(Source.MTP).min_confidence = 0.0  # every draft length gets measured
    prompt = target.tokenize(PROMPT, add_bos=True)
    acceptance = {}
    for k in COST_DRAFT_LENS:
        decoder.controller.configure("mtp", k)
        for _ in decoder.generate(prompt, max_tokens=max_tokens):
            pass
        acceptance[k] = (decoder.stats.accepted, decoder.stats.drafted)
    head = decoder.drafter(Source.MTP).head
    return {"decoder": decoder, "head": head, "target": target, "prompt": prompt, "acceptance": acceptance}


def head_step_shares(measured: dict, repeats: int = 20) -> tuple[float, float]:
    """A head step's cost relative to a one-token target pass, with and without its output projection."""
    import statistics
    from time import perf_counter

    head, target, decoder = measured["head"], measured["target"], measured["decoder"]
    n = len(head.tokens)
    state = target.hidden[n - 1 : n]
    times = {True: [], False: []}
    for _ in range(repeats):
        for logits in (True, False):
            started = perf_counter()
            head.eval([head.tokens[-1]], state, logits=logits)
            times[logits].append(perf_counter() - started)
            head.rollback(n)
    one = decoder.controller.costs.one
    return statistics.median(times[True]) / one, statistics.median(times[False]) / one


def speed_curve(decoder) -> list[tuple[float, int, float]]:
    """(acceptance, best draft length, expected speed / target alone) from the measured costs, through the
    planner's own pricing (checkpoint, restore and replay of the hybrid state included)."""
    from localspec.engine.drafting import Source

    controller = decoder.controller
    step = controller.step_cost(Source.MTP)
    curve = []
    for a in ACCEPTANCES:
        plan = controller._best(Source.MTP, [a] * 16, step, None)  # the planner's expected-value rule
        curve.append((a, plan.k, plan.expected_rate / controller._none_rate()))
    return curve


def break_even(decoder) -> float | None:
    from localspec.engine.drafting import Source

    controller = decoder.controller
    step = controller.step_cost(Source.MTP)
    low, high = 0.0, 1.0
    if controller._best(Source.MTP, [high] * 16, step, None).expected_rate <= controller._none_rate():
        return None
    for _ in range(30):
        mid = (low + high) / 2
        pays = controller._best(Source.MTP, [mid] * 16, step, None).expected_rate > controller._none_rate()
        low, high = (low, mid) if pays else (mid, high)
    return high


def side_by_side(models: dict, bin_dir: str, args) -> None:
    for name, path in models.items():
        report = args.out / f"vs-llama-cpp-{name}.json"
        command = [
            sys.executable, "-m", "localspec", "bench", "--vs-llama-cpp", bin_dir, "--target", str(path),
            "--methods", "none,mtp,auto", "--workloads", args.workloads, "--runs", str(args.runs),
            "--max-tokens", str(args.max_tokens), "--threads", str(args.threads), "--json", str(report),
        ]
        print(" ".join(command), file=sys.stderr)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        print(f"\n{name} ({path.name}): decode speed / stock llama-completion, acceptance")
        for row in overall_rows(json.loads(report.read_text())["rows"]):
            rate = "-" if row["acceptance_rate"] is None else f"{row['acceptance_rate']:.0%}"
            print(f"  {row['engine']:<28} {row['decode_ratio']:.2f}x  accepted {rate:>5}  identical {row['identical']}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where the models and JSON reports go")
    parser.add_argument("--bin", help="stock llama.cpp tools (scripts/build-llama-cpp-stock --cached)")
    parser.add_argument("--type", choices=QUANT_TYPES, default="Q4_K_M", help="weights (default Q4_K_M)")
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--embd", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=248320)
    parser.add_argument("--scales", default="0,0.3,0.6", help="trunk scales of the agreeing heads")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--workloads", default="code-edit,code-new")
    parser.add_argument("--quick", action="store_true", help="a 4-layer, 256-wide, 32k-vocabulary model; costs only")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.embd, args.vocab, args.scales, args.max_tokens = 4, 256, 32000, "0.3", 32
    args.out.mkdir(parents=True, exist_ok=True)
    scales = [float(s) for s in args.scales.split(",")]
    if COST_MODEL.removeprefix("agree-") not in args.scales.split(","):
        scales.append(0.3)
    models = write_models(args.out, scales, layers=args.layers, embd=args.embd, vocab=args.vocab, quant=args.type)

    measured = measure_costs(models[COST_MODEL], threads=args.threads, max_tokens=args.max_tokens)
    decoder = measured["decoder"]
    beliefs = decoder.controller.beliefs()
    print(f"measured on {models[COST_MODEL].name}, {args.threads} threads (the engine's own cost figures):")
    print(f"  pass seconds by batch size: {beliefs['pass_s']}")
    print(f"  head step {decoder.controller.step_cost('mtp'):.5f} s, "
          f"checkpoint {beliefs['checkpoint_s']} s, restore {beliefs['restore_s']} s, "
          f"overhead {beliefs['overhead_s']} s")
    print(f"  acceptance there by draft length (accepted, drafted): {measured['acceptance']}")
    with_output, without_output = head_step_shares(measured)
    print(f"  head step / one-token pass: {with_output:.2f} with its output projection, {without_output:.2f} without "
          f"(the projection is {1 - without_output / with_output:.0%} of a head step)")
    print("\nexpected speed / target alone (each draft position accepted at the same rate, best draft length):")
    for a, k, speed in speed_curve(decoder):
        print(f"  acceptance {a:.1f}: {speed:.2f}x at k={k}")
    even = break_even(decoder)
    print(f"  break-even acceptance: {'never pays' if even is None else f'{even:.2f}'}")
    if args.bin and not args.quick:
        side_by_side(models, args.bin, args)


if __name__ == "__main__":
    main()
