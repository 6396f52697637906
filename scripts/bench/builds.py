"""Two llama-cpp-python builds' target passes, paired: the way to measure a kernel change on a machine whose speed
drifts between runs (a 2-core cloud VM can vary 2x from one process to the next).

Each build runs in a worker process of its own (``--other DIR``: a ``pip install --no-deps --target DIR`` of the
other wheel, put first on its PYTHONPATH; the current .venv is the other side). Both load the model and prefill
the same ``--context`` tokens, then take turns: per round and batch size, each times the median of ``--reps``
passes after rolling back to the prefix, the first to go alternating by round. It prints per batch size each
build's median and the median of the per-round ratios (other / current), with their range.

    .venv/bin/python -m pip install --no-deps --target /tmp/old ~/.cache/localspec/wheels/KEY/*.whl
    .venv/bin/python -m scripts.bench.builds --other /tmp/old [--context 7000] [--model draft] [--rounds 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

SIZES = (1, 2, 4, 8)


def worker(context: int, model: str, threads: int | None) -> None:
    """Loads the model, prefills, prints "ready", then answers each "k reps" line with a median in ms."""
    # In the worker only: the parent loads no build, each worker the one its PYTHONPATH puts first.
    from localspec.engine.llama.model import Model
    from localspec.profiles import DEFAULT_PROFILE
    from localspec.session import resolve_pair
    from scripts.bench.engine import long_prompt, pass_seconds

    if model in ("target", "draft"):
        pair = resolve_pair(profile=DEFAULT_PROFILE, offline=True)
        path = pair.draft if model == "draft" else pair.target
    else:
        path = Path(model)
    target = Model(path, n_ctx=context + max(SIZES) + 64, n_threads=threads)
    tokens = long_prompt(target, context + max(SIZES))
    target.eval(tokens[:context], n_logits=0, prefill=True)
    print("ready", flush=True)
    for line in sys.stdin:
        size, reps = map(int, line.split())
        print(1000 * pass_seconds(target, tokens, context, size, reps), flush=True)


def start(args, pythonpath: str | None) -> subprocess.Popen:
    env = {**os.environ}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "scripts.bench.builds", "--worker", "--context", str(args.context),
               "--model", args.model, *(("--threads", str(args.threads)) if args.threads else ())]
    proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    if proc.stdout.readline().strip() != "ready":
        raise SystemExit(f"the worker for {pythonpath or 'the current build'} did not start")
    return proc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--other", type=Path, help="folder holding the other build's llama_cpp package")
    parser.add_argument("--context", type=int, default=7000)
    parser.add_argument("--model", default="target", help="target or draft (the default pair's), or a GGUF file")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, help="default: the machine's")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.context, args.model, args.threads)
        return
    if args.other is None or not (args.other / "llama_cpp").is_dir():
        raise SystemExit("--other must be a folder with a llama_cpp package (pip install --no-deps --target DIR WHEEL)")
    sides = {"other": start(args, str(args.other)), "current": start(args, None)}
    times: dict[tuple[int, str], list[float]] = {}
    for round_ in range(args.rounds):
        for size in SIZES:
            for name in sorted(sides, reverse=round_ % 2 == 1):
                proc = sides[name]
                proc.stdin.write(f"{size} {args.reps}\n")
                proc.stdin.flush()
                times.setdefault((size, name), []).append(float(proc.stdout.readline()))
    for proc in sides.values():
        proc.stdin.close()
        proc.wait()
    print(f"{args.model} passes after {args.context} tokens, {args.rounds} paired rounds of {args.reps}:")
    for size in SIZES:
        other, current = times[(size, "other")], times[(size, "current")]
        ratios = [o / c for o, c in zip(other, current)]
        print(f"  {size:3} tokens: other {statistics.median(other):7.0f} ms, current {statistics.median(current):7.0f} ms,"
              f" other/current {statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
