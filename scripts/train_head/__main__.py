"""Train an EAGLE-3 drafting head for a llama.cpp target on this machine (CPU, JAX), written as a GGUF that
`localspec run --method eagle3 --draft HEAD.gguf` and stock llama.cpp's `--spec-type draft-eagle3` load.

    .venv/bin/python -m scripts.train_head --target MODEL.gguf --out HEAD.gguf [--text PATH ...] [--minutes N]

Needs the train extra (`pip install -e '.[train]'`). The target answers the training prompts (the bench
workloads' kinds; the shipped bench prompts are held back to measure the head on) and reads the text given
with --text; the three layer inputs it computes on the way, and its greedy tokens, are what the head learns.
The capture and a checkpoint are kept in --work: run it again to train further from where it stopped.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from localspec import paths
from localspec.bench.workloads import load_prompt_file, shipped_prompts
from localspec.engine.llama.model import Model
from localspec.errors import LocalspecError, UsageError
from scripts.train_head.capture import SAMPLE_TEMPERATURE

PROMPTS = Path(__file__).with_name("prompts.jsonl")
DEFAULT_DRAFT_VOCAB = 8192


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.train_head", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, required=True, help="the target model's GGUF")
    parser.add_argument("--out", type=Path, required=True, help="where to write the head's GGUF")
    parser.add_argument("--text", type=Path, action="append", default=[],
                        help="a text file or a folder of them to learn from too (repeatable)")
    parser.add_argument("--minutes", type=float, default=20.0, help="training time of this run (default 20)")
    parser.add_argument("--prompts", type=Path, default=PROMPTS, help="training prompts, bench JSONL format")
    parser.add_argument("--held", type=Path, default=None,
                        help="held-back prompts to measure on (default: the shipped bench prompts)")
    parser.add_argument("--work", type=Path, default=None,
                        help="capture and checkpoint folder (default: $LOCALSPEC_HOME/train-head/TARGET)")
    parser.add_argument("--fresh", action="store_true", help="capture and train from scratch")
    parser.add_argument("--max-tokens", type=int, default=384, help="tokens per training answer")
    parser.add_argument("--samples", type=int, default=2,
                        help="answers sampled per training prompt besides the greedy one (default 2)")
    parser.add_argument("--temperature", type=float, default=SAMPLE_TEMPERATURE,
                        help=f"temperature of the sampled answers (default {SAMPLE_TEMPERATURE})")
    parser.add_argument("--text-tokens", type=int, default=100_000, help="at most this many tokens of --text")
    parser.add_argument("--draft-vocab", type=int, default=DEFAULT_DRAFT_VOCAB,
                        help="the head's vocabulary: the target's most used tokens")
    parser.add_argument("--steps", type=int, default=3, help="chained steps of the training-time test")
    parser.add_argument("--window", type=int, default=512, help="entries per training window")
    parser.add_argument("--batch", type=int, default=4, help="windows per step")
    parser.add_argument("--lr", type=float, default=1e-3, help="peak learning rate")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--f32", action="store_true", help="write float32 matrices (default: float16)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    try:
        import jax  # noqa: F401 (only to say what is missing before any work)
    except ImportError:
        print("error: JAX is missing; install the train extra: .venv/bin/pip install -e '.[train]'", file=sys.stderr)
        return 1
    args = parse_args(argv)
    try:
        run(args)
    except (UsageError, LocalspecError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def run(args: argparse.Namespace) -> None:
    import jax.numpy as jnp

    from scripts.train_head import capture, train
    from scripts.train_head.head import HeadShape, init_params
    from scripts.train_head.layout import default_layers
    from scripts.train_head.target_file import borrowed_weights, target_info, write_head

    started = time.perf_counter()
    target = target_info(args.target)
    layers = default_layers(target.n_layers)
    for path in args.text:
        if not path.exists():
            raise UsageError(f"{path} does not exist: give --text an existing file or folder")
    prompts = load_prompt_file(args.prompts)
    held_prompts = load_prompt_file(args.held) if args.held else shipped_prompts()
    held_prompts = [p for p in held_prompts if p.turns]  # an editor's infill request is no chat
    work = args.work or paths.home() / "train-head" / args.target.stem
    work.mkdir(parents=True, exist_ok=True)
    print(f"target {args.target.name}: {target.architecture}, {target.n_layers} layers, width {target.n_embd}; "
          f"the head reads the inputs of layers {list(layers)}")

    # What was captured is reused while the target, the prompts and the text are the same.
    key = _capture_key(args, layers)
    meta, train_file, held_file = work / "capture.json", work / "train.npz", work / "held.npz"
    captured = args.fresh or not meta.exists() or json.loads(meta.read_text()) != key
    if captured:
        model = Model(args.target, n_ctx=max(4096, args.window + 64))
        try:
            cap = capture.Capture(model, layers)
            windows = capture.text_windows(model, capture.text_files(args.text), args.window, args.text_tokens)
            capture.save(train_file, capture.capture_all(cap, prompts, windows, max_tokens=args.max_tokens,
                                                         report=_progress, samples=args.samples,
                                                         temperature=args.temperature))
            capture.save(held_file, capture.capture_all(cap, held_prompts, [], max_tokens=args.max_tokens,
                                                        report=_progress))
        finally:
            model.close()
        print(file=sys.stderr)
        meta.write_text(json.dumps(key))
        for stale in work.glob("checkpoint*.npz"):
            stale.unlink()
    capture_s = time.perf_counter() - started
    train_seqs, held_seqs = capture.load(train_file), capture.load(held_file)
    learnt = sum(len(s.labels) - s.first for s in train_seqs)
    answers = sum(len(s.labels) - s.first for s in train_seqs if s.first > 0)
    print(f"training tokens: {learnt} ({answers} of the target's answers to {len(prompts)} prompts, "
          f"{learnt - answers} of text); held back: {sum(len(s.labels) - s.first for s in held_seqs)} answer "
          f"tokens to {len(held_prompts)} prompts")

    options = train.Options(steps=args.steps, window=args.window, batch=args.batch, lr=args.lr)
    checkpoint = work / "checkpoint.npz"
    state = d2t = None
    if checkpoint.exists() and not args.fresh:
        state, d2t = train.State.load(checkpoint)
        print(f"resuming after {state.epochs} epochs ({state.trained_s / 60:.1f} min of training)")
    else:
        d2t = train.draft_vocabulary(train_seqs, args.draft_vocab)
    covered = np.isin(np.concatenate([s.labels[s.first :] for s in held_seqs]), d2t).mean()
    print(f"draft vocabulary: {len(d2t)} tokens, covering {covered:.1%} of the held-back answers' tokens")

    embed, output_norm, output = borrowed_weights(args.target)
    shape = HeadShape(n_embd=target.n_embd, n_head=target.n_head, head_dim=target.n_embd // target.n_head,
                      n_ff=target.n_ff or 4 * target.n_embd, n_features=len(layers) * target.n_embd,
                      draft_vocab=len(d2t))
    if state is None:
        state = train.State.fresh(init_params(shape, output_norm, output[d2t], args.seed))
    train_windows = train.Windows.make(train_seqs, d2t, options)
    held_windows = train.Windows.make(held_seqs, d2t, options)
    state = train.train(state, shape, jnp.asarray(embed), train_windows, held_windows, options,
                        seconds=args.minutes * 60, seed=args.seed, report=print,
                        checkpoint=lambda s: s.save(checkpoint, d2t))
    accepted = train.acceptance(state.params, shape, jnp.asarray(embed), held_windows, options)
    write_head(args.out, target, shape, layers, state.params, d2t, f16=not args.f32)
    capture_time = f"{capture_s / 60:.1f} min" if captured else "reused"
    print(f"capture {capture_time}, training {state.trained_s / 60:.1f} min in all ({state.epochs} "
          f"epochs); first-token top-1 acceptance on held-back answers {accepted[0]:.3f}, chained steps "
          f"{' '.join(f'{a:.3f}' for a in accepted[1:])}")
    print(f"wrote {args.out}")


def _capture_key(args: argparse.Namespace, layers: tuple[int, ...]) -> dict:
    """What the capture depends on: the target file, the layers, the prompts, the text and its budget."""
    digest = hashlib.sha256()
    for path in [args.prompts, *([args.held] if args.held else [])]:
        digest.update(path.read_bytes())
    stat = args.target.stat()
    return {"target": [str(args.target.resolve()), stat.st_size, stat.st_mtime], "layers": list(layers),
            "prompts": digest.hexdigest(), "text": [str(p.resolve()) for p in args.text],
            "text_tokens": args.text_tokens, "max_tokens": args.max_tokens, "window": args.window,
            "samples": args.samples, "temperature": args.temperature}


def _progress(line: str) -> None:
    print(f"\r{line}", end="", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
