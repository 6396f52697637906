"""MTP, EAGLE-3 and DFlash drafting at Qwen3.5-0.8B's shapes: speed against the target alone as a function
of acceptance, and side by side with stock llama.cpp's ``--spec-type draft-mtp``, ``draft-eagle3`` and
``draft-dflash`` on the same files.

Real weights cannot be fetched here, so acceptance is made, not found. Every model is Qwen3.5-0.8B's
shapes (scripts/models/hybrid.py) plus one MTP block, seeded random:

- ``agree-S``: a head that predicts what a bigram model would, beside a trunk whose layers are scaled by
  S (tests/tiny_models.py: ``mtp_agrees``, ``trunk_scale``). At S = 0 the target is that bigram model and
  every greedy draft is accepted; larger S makes the target lean on its context and the head miss more.
- ``random``: a seeded-random head, which nearly never agrees (the cost of drafting for nothing).
- with ``--eagle3``, an EAGLE-3 head beside ``random`` (tests/tiny_models.py: ``write_tiny_eagle3_head``),
  seeded random, as published heads are shaped: one block of the target's width reading layers 2, L/2 and
  L - 3, its own output projection over a 32k-token draft vocabulary (d2t). No head can be made to agree
  with its target by construction here (its token enters only through attention), so its acceptance is
  near 0 and only the cost curve says what it would give.
- with ``--dflash``, a DFlash head beside ``random`` (``write_tiny_dflash_head``), seeded random, float16:
  5 blocks of the target's width reading 5 target layers, 16-token blocks, the target's embeddings and
  output projection (as DFlash drafts for Qwen3 are reported to be shaped). Like EAGLE-3's, only its cost
  curve says what it would give; a block of k drafts costs one head pass of k + 1 rows.

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

With ``--extrapolate-to N`` (for Qwen3.5-27B, the largest dense Qwen3.5/3.6: ``--shape 27b --layers 4
--extrapolate-to 64``), the MTP head is measured on random models of ``--layers`` and twice as many layers
at that model's published widths (0.8b's as ``--embd`` and ``--vocab`` scale them), and priced at N
layers: each pass size's cost is extended along the line through the two depths (per-layer cost plus what
does not grow with depth: embeddings, output projection, launch), a hybrid checkpoint and restore in
proportion to the layers (the recurrent state is per layer), and the head step and round overhead as
measured (the head is one block and the output projection whatever the trunk's depth). Said in the
output: figures for N layers are extrapolated.

Run it alone on the machine (every timing is contaminated by other processes):

    .venv/bin/python -m scripts.bench.heads /tmp/mtp-bench --bin "$(scripts/build-llama-cpp-stock --cached)"
    .venv/bin/python -m scripts.bench.heads /tmp/mtp-bench --quick     # a smoke run: a small model, costs only
    .venv/bin/python -m scripts.bench.heads /tmp/mtp-bench --eagle3 --scales 0.3 --bin ...  # the EAGLE-3 head too
    .venv/bin/python -m scripts.bench.heads /tmp/mtp-bench --dflash --scales 0.3 --bin ...  # the DFlash head too
    .venv/bin/python -m scripts.bench.heads /tmp/27b --shape 27b --layers 4 --extrapolate-to 64  # Qwen3.5-27B
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from localspec.bench.stock import overall_rows
from localspec.gguf.header import read_header
from localspec.gguf.heads import HeadFile, companion_head
from scripts.models.hybrid import QUANT_TYPES, SHAPES, make_hybrid_model, qwen35_0_8b_spec, qwen35_27b_spec
from tests.tiny_models import write_tiny_dflash_head, write_tiny_eagle3_head

ACCEPTANCES = (0.5, 0.6, 0.7, 0.8, 0.9)
COST_MODEL = "agree-0.3"
COST_DRAFT_LENS = (1, 2, 3, 4, 6, 8)
EAGLE3_DRAFT_VOCAB = 32000  # published EAGLE-3 heads' draft vocabulary
DFLASH_LAYERS, DFLASH_BLOCK = 5, 16
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


def write_head(kind: str, out: Path, *, layers: int, embd: int, vocab: int) -> HeadFile:
    """An EAGLE-3 or DFlash head for the ``random`` target (float16, as converted heads ship), written once."""
    spec = replace(qwen35_0_8b_spec(layers=layers, embd=embd, vocab=vocab), f16=True, n_head=16)
    path = out / f"{kind}-head-{layers}x{embd}-f16.gguf"
    if not path.exists():
        print(f"writing {path}", file=sys.stderr)
        if kind == "eagle3":
            write_tiny_eagle3_head(path, spec, (2, layers // 2, layers - 3), draft_vocab=min(EAGLE3_DRAFT_VOCAB, vocab))
        else:
            target_layers = tuple(1 + i * (layers - 3) // (DFLASH_LAYERS - 1) for i in range(DFLASH_LAYERS))
            write_tiny_dflash_head(path, spec, target_layers, n_layers=DFLASH_LAYERS, block_size=DFLASH_BLOCK)
    return companion_head(path, read_header(path))


def measure_costs(path: Path, *, threads: int, max_tokens: int, head: HeadFile | None = None) -> dict:
    """The controller's measured costs after head rounds of several draft lengths on ``path``: its MTP
    head's, or with ``head`` (a companion) that head's."""
    from localspec.engine.decoding.decoder import SpeculativeDecoder
    from localspec.engine.drafters.mtp import MtpDrafter
    from localspec.engine.llama.model import Model

    source = head.kind if head is not None else MtpDrafter.source  # a head's method is its drafter's source
    target = Model(path, n_ctx=4096, n_threads=threads, load_mtp=head is None)
    decoder = SpeculativeDecoder(target, method=source, head=head)
    if head is None:
        decoder.drafter(source).min_confidence = 0.0  # every draft length gets measured
    prompt = target.tokenize(PROMPT, add_bos=True)
    acceptance = {}
    for k in COST_DRAFT_LENS:
        decoder.controller.configure(source, k)
        for _ in decoder.generate(prompt, max_tokens=max_tokens):
            pass
        acceptance[k] = (decoder.stats.accepted, decoder.stats.drafted)
    return {"decoder": decoder, "head": decoder.drafter(source).head, "target": target, "prompt": prompt,
            "acceptance": acceptance, "source": source}


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


def longest(source) -> int:
    return DFLASH_BLOCK - 1 if source == "dflash" else 16


def speed_curve(controller, source: str, step: float) -> list[tuple[float, int, float]]:
    """(acceptance, best draft length, expected speed / target alone) from the measured costs and a draft
    ``step``'s seconds, through the planner's own pricing (checkpoint, restore and replay of the hybrid
    state included; a DFlash block as one head pass of its rows)."""
    curve = []
    for a in ACCEPTANCES:
        plan = controller.best_plan(source, [a] * longest(source), step, None)  # the planner's expected-value rule
        curve.append((a, plan.k, plan.expected_rate / controller.target_alone_rate()))
    return curve


def break_even(controller, source: str, step: float) -> float | None:
    """The lowest acceptance at which drafting beats the target alone; None if even 1.0 does not."""

    def pays(rate: float) -> bool:
        plan = controller.best_plan(source, [rate] * longest(source), step, None)
        return plan.expected_rate > controller.target_alone_rate()

    if not pays(1.0):
        return None
    low, high = 0.0, 1.0
    for _ in range(30):
        mid = (low + high) / 2
        low, high = (low, mid) if pays(mid) else (mid, high)
    return high


def print_costs(measured: dict, model: Path, threads: int) -> None:
    """The engine's own cost figures after head rounds, and the speed they imply by acceptance."""
    decoder, source = measured["decoder"], measured["source"]
    beliefs = decoder.controller.beliefs()
    step = decoder.controller.step_cost(source)
    print(f"{source} head measured on {model.name}, {threads} threads (the engine's own cost figures):")
    print(f"  pass seconds by batch size: {beliefs['pass_s']}")
    what = "head pass of one row" if source == "dflash" else "head step"
    print(f"  {what} {step:.5f} s = {step / decoder.controller.costs.one:.2f} of a one-token pass, "
          f"checkpoint {beliefs['checkpoint_s']} s, restore {beliefs['restore_s']} s, "
          f"overhead {beliefs['overhead_s']} s")
    print(f"  acceptance there by draft length (accepted, drafted): {measured['acceptance']}")
    print("\nexpected speed / target alone (each draft position accepted at the same rate, best draft length):")
    print_curve(decoder.controller, source, step)


def print_curve(controller, source: str, step: float) -> None:
    for a, k, speed in speed_curve(controller, source, step):
        print(f"  acceptance {a:.1f}: {speed:.2f}x at k={k}")
    even = break_even(controller, source, step)
    print(f"  break-even acceptance: {'never pays' if even is None else f'{even:.2f}'}")


def extrapolate(args) -> None:
    """The MTP head of a ``--shape`` model priced at ``--extrapolate-to`` layers from two shallow copies."""
    from localspec.engine.drafters.mtp import MtpDrafter
    from localspec.engine.planner.controller import Controller
    from localspec.engine.planner.costs import TRUSTED_SAMPLES

    depths = (args.layers, 2 * args.layers)
    measured = {}
    for depth in depths:
        if args.shape == "27b":
            spec = qwen35_27b_spec(layers=depth)
        else:
            spec = qwen35_0_8b_spec(layers=depth, embd=args.embd, vocab=args.vocab)
        path = args.out / f"qwen35-{args.shape}-{depth}x{spec.n_embd}-mtp-{args.type}.gguf"
        if not path.exists():
            print(f"writing {path}", file=sys.stderr)
            make_hybrid_model(path, replace(spec, mtp=True), quant_type=args.type)
        measured[depth] = measure_costs(path, threads=args.threads, max_tokens=args.max_tokens)
        print_costs(measured[depth], path, args.threads)
        print()
    shallow, deep = (measured[d]["decoder"].controller for d in depths)
    full_depth = args.extrapolate_to
    scale = (full_depth - depths[0]) / (depths[1] - depths[0])
    full = Controller(MtpDrafter.source, drafters=[MtpDrafter], rollback_window=shallow.rollback_window)
    near, far = shallow.costs.measured_passes(), deep.costs.measured_passes()
    for size in sorted(set(near) & set(far)):
        for _ in range(TRUSTED_SAMPLES):
            full.costs.record_pass(size, near[size] + scale * (far[size] - near[size]))
    per_layer = full_depth / depths[1]
    full.costs.checkpoint_s = (deep.costs.checkpoint_s or 0.0) * per_layer
    full.costs.restore_s = (deep.costs.restore_s or 0.0) * per_layer
    full.overheads.alone = shallow.overheads.alone
    step = shallow.step_cost(MtpDrafter.source)  # one block and the output projection, at any depth
    one = full.costs.one
    print(f"EXTRAPOLATED to {full_depth} layers ({args.shape}) from {depths[0]} and {depths[1]} layers:")
    print(f"  one-token pass {one:.3f} s ({1 / one:.2f} tok/s target alone); pass / one-token pass by batch size: "
          + ", ".join(f"{b}: {full.costs.pass_cost(b) / one:.2f}" for b in (2, 3, 4, 5, 7, 9) if b in near))
    print(f"  head step {step:.4f} s = {step / one:.3f} of a one-token pass; checkpoint {full.costs.checkpoint_s:.4f} s, "
          f"restore {full.costs.restore_s:.4f} s (in proportion to the layers)")
    print("expected speed / target alone (each draft position accepted at the same rate, best draft length):")
    print_curve(full, MtpDrafter.source, step)


def side_by_side(models: dict, bin_dir: str, args, head: HeadFile | None = None) -> None:
    """Each model against stock; with ``head`` (a companion head), the models with that head as the draft."""
    for name, path in models.items():
        report = args.out / f"vs-llama-cpp-{name}{'-' + head.kind if head else ''}.json"
        command = [
            sys.executable, "-m", "localspec", "bench", "--vs-llama-cpp", bin_dir, "--target", str(path),
            *(("--draft", str(head.path), "--methods", f"none,{head.kind},auto") if head
              else ("--methods", "none,mtp,auto")),
            "--workloads", args.workloads, "--runs", str(args.runs),
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
    parser.add_argument("--shape", choices=SHAPES, default="0.8b", help="whose published widths (with --extrapolate-to)")
    parser.add_argument("--extrapolate-to", type=int, help="price the MTP head at this many layers (see above)")
    parser.add_argument("--eagle3", action="store_true", help="an EAGLE-3 head beside the random model, measured too")
    parser.add_argument("--dflash", action="store_true", help="a DFlash head beside the random model, measured too")
    parser.add_argument("--heads-only", action="store_true", help="measure the companion heads only, not the MTP head")
    args = parser.parse_args(argv)
    if args.quick:
        args.layers, args.embd, args.vocab, args.scales, args.max_tokens = 4, 256, 32000, "0.3", 32
    args.out.mkdir(parents=True, exist_ok=True)
    if args.extrapolate_to:
        extrapolate(args)
        return
    scales = [float(s) for s in args.scales.split(",")]
    if COST_MODEL.removeprefix("agree-") not in args.scales.split(","):
        scales.append(0.3)
    models = write_models(args.out, scales, layers=args.layers, embd=args.embd, vocab=args.vocab, quant=args.type)

    if not args.heads_only:
        measured = measure_costs(models[COST_MODEL], threads=args.threads, max_tokens=args.max_tokens)
        print_costs(measured, models[COST_MODEL], args.threads)
        with_output, without_output = head_step_shares(measured)
        print(f"  head step / one-token pass: {with_output:.2f} with its output projection, {without_output:.2f} "
              f"without (the projection is {1 - without_output / with_output:.0%} of a head step)")
    heads = [write_head(kind, args.out, layers=args.layers, embd=args.embd, vocab=args.vocab)
             for kind in ("eagle3", "dflash") if getattr(args, kind)]
    for head in heads:
        print()
        measured = measure_costs(models["random"], threads=args.threads, max_tokens=args.max_tokens, head=head)
        print_costs(measured, models["random"], args.threads)
    if args.bin and not args.quick:
        if not args.heads_only:
            side_by_side(models, args.bin, args)
        for head in heads:
            side_by_side({"random": models["random"]}, args.bin, args, head)


if __name__ == "__main__":
    main()
