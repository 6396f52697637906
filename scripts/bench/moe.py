"""The verification cost curve of mixture-of-experts targets at real per-layer shapes, fewer layers.

Verifying k drafts is one target pass of k + 1 tokens; on a dense model its cost grows slowly with k, on a
MoE each token routes to its own experts, so a pass reads the union of their weights and grows faster
(ik_llama.cpp #1630). This writes seeded-random models with the per-layer shapes below (tests/tiny_models.py,
quantized by llama.cpp's own quantizer), times passes of 1..33 tokens through the engine's ``Model``
(a hybrid's state restored from a checkpoint after each, outside the timing), interleaved by size, and
prints each size's cost relative to a one-token pass beside a dense model of the same active width, and
what the planner makes of it: the best draft length and expected speed at acceptance 0.5-0.9, priced by
the controller from these measured costs (what ``auto`` does on such a target).

Shapes (per layer; vocabulary and layer count as given, the published models have 48 and 40 layers):
- qwen3-coder-30b-a3b (qwen3moe): hidden 2048, 32 heads, 4 KV heads, head 128, 128 experts of 768, 8 used,
  vocabulary 151936 (Qwen3-30B-A3B's config, read from a public training script's model arguments).
- qwen3.6-35b-a3b (qwen35moe): hidden 2048, 16 heads, 2 KV heads, head 256, 256 experts of 512, 8 used
  plus one shared expert of 512, Gated DeltaNet with 16 key and 32 value heads of 128, attention every
  4th layer, vocabulary 248320. Not verified here against the published config (unreachable from where
  this was written): from memory of Qwen3.5-35B-A3B's, which Qwen3.6-35B-A3B shares.

Run it alone (every timing is contaminated by other processes; a 4-layer model takes a few minutes and
~6 GB of memory to write):

    .venv/bin/python -m scripts.bench.moe /tmp/moe-bench
    .venv/bin/python -m scripts.bench.moe /tmp/moe-bench --quick    # a smoke run: 16 experts, 256 wide
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from time import perf_counter

from scripts.models.hybrid import QUANT_TYPES, make_hybrid_model, vocabulary
from tests.tiny_models import TinySpec

SIZES = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 33)
ACCEPTANCES = (0.5, 0.6, 0.7, 0.8, 0.9)
SHAPES = {
    "qwen3-coder-30b-a3b": TinySpec(
        architecture="qwen3moe", n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=128,
        n_expert_used=8, n_ff_expert=768, n_ff=768, n_ctx=32768, f16=True, tokens=vocabulary(151936),
    ),
    "qwen3.6-35b-a3b": TinySpec(
        architecture="qwen35moe", n_embd=2048, n_head=16, n_head_kv=2, head_dim=256, n_expert=256,
        n_expert_used=8, n_ff_expert=512, n_ff=512, n_ctx=32768, full_attention_interval=4, conv_kernel=4,
        ssm_state=128, ssm_groups=16, ssm_heads=32, f16=True, tokens=vocabulary(248320),
    ),
}


def dense_twin(spec: TinySpec) -> TinySpec:
    """The same model with one dense feed-forward as wide as the experts a token uses (its active width)."""
    active = spec.n_ff_expert * (spec.n_expert_used + (spec.architecture == "qwen35moe"))
    layout = {"qwen3moe": "llama", "qwen35moe": "qwen35"}[spec.architecture]
    return replace(spec, architecture=layout, n_expert=0, n_expert_used=0, n_ff_expert=0, n_ff=active)


def pass_costs(path: Path, *, threads: int, repeats: int) -> dict[int, float]:
    """Median seconds of a pass of each size after a 64-token prompt, sizes interleaved."""
    from localspec.engine.llama.model import Model

    model = Model(path, n_ctx=512, n_threads=threads)
    prompt = model.tokenize("def parse(line):\n    return line.split(',')\n" * 4, add_bos=True)[:64]
    model.eval(prompt, n_logits=0, prefill=True)
    tokens = (prompt * 2)[: max(SIZES)]
    times: dict[int, list[float]] = {size: [] for size in SIZES}
    for _ in range(repeats):
        for size in SIZES:
            model.checkpoint()
            started = perf_counter()
            model.eval(tokens[:size], n_logits=size)
            times[size].append(perf_counter() - started)
            model.rollback(len(prompt))  # back to the checkpoint: nothing to replay
    return {size: statistics.median(samples) for size, samples in times.items()}


def planner_view(costs: dict[int, float]) -> list[tuple[float, int, float]]:
    """(acceptance, best draft length, expected speed / target alone) as the controller prices a copy
    drafter (free drafts) on these pass costs."""
    from localspec.engine.drafters.lookup import LookupDrafter
    from localspec.engine.planner.controller import Controller

    controller = Controller("lookup")  # the method that drafts from prompt lookup only
    for size, seconds in costs.items():
        for _ in range(3):
            controller.costs.record_pass(size, seconds)
    rows = []
    for a in ACCEPTANCES:
        plan = controller.best_plan(LookupDrafter.source, [a] * (max(SIZES) - 1), 0.0, None)  # the planner's rule
        rows.append((a, plan.k, plan.expected_rate / controller.target_alone_rate()))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="where the models go")
    parser.add_argument("--shapes", default=",".join(SHAPES), help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--type", choices=QUANT_TYPES, default="Q4_K_M")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="16 experts, 256 wide, 32k vocabulary")
    args = parser.parse_args(argv)
    if args.layers % 4:
        parser.error("--layers must be a multiple of 4 (Qwen3.6 has attention in every 4th layer only)")
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.shapes.split(","):
        spec = replace(SHAPES[name], n_layers=args.layers)
        if args.quick:
            spec = replace(spec, n_embd=256, n_expert=16, n_ff_expert=64, n_ff=64, head_dim=64,
                           ssm_state=32, tokens=vocabulary(32000))
        curves = {}
        for label, variant in (("moe", spec), ("dense twin", dense_twin(spec))):
            path = args.out / f"{name}-{label.replace(' ', '-')}-{spec.n_layers}L-{spec.n_embd}-{args.type}.gguf"
            if not path.exists():
                print(f"writing {path}", file=sys.stderr)
                make_hybrid_model(path, variant, quant_type=args.type)
            curves[label] = pass_costs(path, threads=args.threads, repeats=args.repeats)
        moe, dense = curves["moe"], curves["dense twin"]
        print(f"\n{name}, {spec.n_layers} layers, {args.type}, {args.threads} threads: pass cost / one-token pass")
        print(f"  {'tokens':>6}  {'moe':>6}  {'dense twin':>10}   (one-token pass: moe {moe[1] * 1e3:.1f} ms, "
              f"dense twin {dense[1] * 1e3:.1f} ms)")
        for size in SIZES:
            print(f"  {size:>6}  {moe[size] / moe[1]:>6.2f}  {dense[size] / dense[1]:>10.2f}")
        print("  the planner on these costs (free drafts, each position accepted at the same rate):")
        for (a, k, speed), (_, k_dense, speed_dense) in zip(planner_view(moe), planner_view(dense)):
            print(f"    acceptance {a:.1f}: moe {speed:.2f}x at k={k}; dense twin {speed_dense:.2f}x at k={k_dense}")


if __name__ == "__main__":
    main()
