"""What rolling back a hybrid or recurrent model costs, per verification, as a ratio to a one-token pass.

    .venv/bin/python -m scripts.bench.rollback MODEL.gguf [--ctx 4096] [--threads N] [--repeats 5]

For each draft length k it times, after a prompt of --context tokens:
- the verification pass of k + 1 tokens with per-token snapshots kept (llama.cpp's n_rs_seq) and
  without (what snapshots cost each pass);
- rolling back half the drafts through the snapshots (free, in place);
- the other method: saving a checkpoint before the pass, then restoring it and replaying the accepted
  half (what a model without snapshots, or a draft longer than them, pays).
And the memory: one recurrent state, the snapshots, and the context's resident memory with and without
them at --ctx. Figures are medians; run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import psutil

from localspec.engine.llama.memory import DEFAULT_ROLLBACK_SNAPSHOTS
from localspec.engine.llama.model import Model

DRAFT_LENGTHS = (1, 2, 4, 8, 16, 32)


def load(path: Path, args, snapshots: int) -> tuple[Model, int]:
    """The model and the resident bytes its context added (weights are mapped, the context is not)."""
    rss = psutil.Process().memory_info().rss
    model = Model(path, n_ctx=args.ctx, n_threads=args.threads, rollback_snapshots=snapshots)
    return model, psutil.Process().memory_info().rss - rss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--context", type=int, default=256, help="prompt tokens before the measured passes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--snapshots", type=int, default=DEFAULT_ROLLBACK_SNAPSHOTS,
                        help=f"n_rs_seq of the snapshot context (default {DEFAULT_ROLLBACK_SNAPSHOTS})")
    args = parser.parse_args(argv)

    plain, plain_rss = load(args.model, args, 0)
    snap, snap_rss = load(args.model, args, args.snapshots)
    plan = snap.memory_plan
    print(f"{args.model.name}: {plan.describe()}")
    print(f"memory at n_ctx {args.ctx}: one recurrent state {plan.checkpoint_bytes / 2**20:.1f} MiB; "
          f"{plan.snapshots} snapshots {plan.snapshots * plan.checkpoint_bytes / 2**20:.1f} MiB; context resident "
          f"{plain_rss / 2**20:.0f} MiB without snapshots, {snap_rss / 2**20:.0f} MiB with")

    # Any tokens do: pass costs depend on shapes and types, not on values.
    prompt = [(i * 7919) % (plain.n_vocab - 300) + 256 for i in range(args.context + 64)]
    for model in (plain, snap):
        model.eval(prompt[: args.context], n_logits=0, prefill=True)
        model.checkpoint()  # every measurement below starts from here, restored untimed
    base = args.context

    def timed(run) -> float:
        started = time.perf_counter()
        run()
        return time.perf_counter() - started

    ones = []
    for _ in range(args.repeats):
        ones.append(timed(lambda: snap.eval(prompt[base : base + 1])))
        snap.rollback(base)
    one = statistics.median(ones)
    print(f"one-token pass: {one * 1e3:.1f} ms; figures below are ratios to it")
    print("| k drafts | pass of k+1, no snapshots | pass of k+1, snapshots | roll back k/2 in place "
          "| save checkpoint | restore + replay 1 + k/2 |")
    print("|---|---|---|---|---|---|")
    for k in DRAFT_LENGTHS:
        batch, keep = prompt[base : base + k + 1], base + 1 + k // 2
        rows = {name: [] for name in ("plain", "snap", "in place", "save", "restore")}
        for _ in range(args.repeats):
            rows["snap"].append(timed(lambda: snap.eval(batch, n_logits=len(batch))))
            rows["in place"].append(snap.rollback(keep) if snap.can_remove(k) else float("nan"))
            snap.rollback(base)
            rows["save"].append(plain.checkpoint())
            rows["plain"].append(timed(lambda: plain.eval(batch, n_logits=len(batch))))
            rows["restore"].append(plain.rollback(keep))
            plain.rollback(base)
        ratios = [statistics.median(rows[name]) / one for name in ("plain", "snap", "in place", "save", "restore")]
        print(f"| {k} | " + " | ".join(f"{r:.3f}" for r in ratios) + " |")


if __name__ == "__main__":
    main()
