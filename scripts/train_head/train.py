"""Training the head in JAX on the captured sequences: windows of the head's entries, AdamW, a time budget,
and a checkpoint a later run resumes from."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from scripts.train_head.capture import Sequence
from scripts.train_head.head import HeadShape, top1_hits, ttt_loss

WARMUP_STEPS = 50
BETAS = (0.9, 0.95)
WEIGHT_DECAY = 0.01


@dataclass(frozen=True)
class Options:
    steps: int = 3  # chained steps of the training-time test
    decay: float = 0.8  # loss weight of step k: decay^k
    window: int = 512  # entries per window (the head attends within one)
    batch: int = 4
    lr: float = 1e-3


def draft_vocabulary(sequences: list[Sequence], size: int) -> np.ndarray:
    """The target ids of the ``size`` tokens the target says most often where it is learnt from, most
    frequent first (``d2t``)."""
    counts = Counter()
    for s in sequences:
        counts.update(s.labels[s.first :].tolist())
    return np.asarray([token for token, _ in counts.most_common(size)], np.int64)


@dataclass
class Windows:
    """Windows of entries, stacked: entry j of a window at offset s is built from tokens[s + j + 1] and
    features[s + j], and judged at step k by labels[s + j + k + 1] (draft ids, -1 outside the vocabulary)."""

    tokens: np.ndarray  # (W, window + steps - 1)
    features: np.ndarray  # (W, window, n_features) float16
    labels: np.ndarray  # (W, window + steps - 1)
    mask: np.ndarray  # (W, window + steps - 1) float32

    @classmethod
    def make(cls, sequences: list[Sequence], d2t: np.ndarray, options: Options) -> Windows:
        to_draft = {int(t): i for i, t in enumerate(d2t)}
        t, extra = options.window, options.steps - 1
        rows = []
        for s in sequences:
            n = len(s.labels)
            draft = np.asarray([to_draft.get(int(x), -1) for x in s.labels], np.int32)
            learnt = (np.arange(n) >= s.first).astype(np.float32)
            for start in range(0, n - 1, t):
                def cut(values, length, offset, fill):
                    piece = values[start + offset : start + offset + length]
                    return np.concatenate([piece, np.full((length - len(piece), *values.shape[1:]), fill,
                                                          values.dtype)])
                rows.append((cut(s.tokens, t + extra, 1, 0), cut(s.features, t, 0, 0),
                             cut(draft, t + extra, 1, -1), cut(learnt, t + extra, 1, 0)))
        return cls(*(np.stack(column) for column in zip(*rows)))

    def __len__(self) -> int:
        return len(self.tokens)

    def take(self, index) -> tuple[jax.Array, ...]:
        return (jnp.asarray(self.tokens[index]), jnp.asarray(self.features[index], jnp.float32),
                jnp.asarray(self.labels[index]), jnp.asarray(self.mask[index]))


@partial(jax.jit, static_argnames=("shape", "steps", "decay"))
def _train_step(params, moments, count, lr, embed, batch, *, shape: HeadShape, steps: int, decay: float):
    loss, grads = jax.value_and_grad(ttt_loss)(params, shape, embed, *batch, steps, decay)
    count = count + 1
    b1, b2 = BETAS
    first = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, moments[0], grads)
    second = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * g * g, moments[1], grads)

    def update(p, m, v):
        step = (m / (1 - b1**count)) / (jnp.sqrt(v / (1 - b2**count)) + 1e-8)
        decayed = p * (1 - lr * WEIGHT_DECAY) if p.ndim == 2 else p  # AdamW: decay matrices, not norms
        return decayed - lr * step

    return jax.tree.map(update, params, first, second), (first, second), count, loss


@partial(jax.jit, static_argnames=("shape", "steps"))
def _hits(params, embed, batch, *, shape: HeadShape, steps: int):
    return top1_hits(params, shape, embed, *batch, steps)


def acceptance(params, shape: HeadShape, embed, windows: Windows, options: Options) -> np.ndarray:
    """Per chained step, the share of learnt positions whose draft argmax is the target's token (the
    earlier steps' tokens right, as greedy verification accepts them)."""
    totals = np.zeros((options.steps, 2))
    for start in range(0, len(windows), options.batch):
        index = np.arange(start, min(start + options.batch, len(windows)))
        totals += np.asarray(_hits(params, embed, windows.take(index), shape=shape, steps=options.steps))
    return totals[:, 0] / np.maximum(totals[:, 1], 1)


@dataclass
class State:
    params: dict
    moments: tuple
    count: jax.Array
    trained_s: float = 0.0
    epochs: int = 0

    @classmethod
    def fresh(cls, params: dict) -> State:
        zeros = jax.tree.map(jnp.zeros_like, params)
        return cls(params, (zeros, zeros), jnp.zeros((), jnp.int32))

    def save(self, path: Path, d2t: np.ndarray) -> None:
        arrays = {f"p/{k}": np.asarray(v) for k, v in self.params.items()}
        arrays |= {f"m/{k}": np.asarray(v) for k, v in self.moments[0].items()}
        arrays |= {f"v/{k}": np.asarray(v) for k, v in self.moments[1].items()}
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, d2t=d2t, count=np.asarray(self.count), trained_s=self.trained_s, epochs=self.epochs, **arrays)
        tmp.replace(path)  # a run stopped while saving keeps the last checkpoint whole

    @classmethod
    def load(cls, path: Path) -> tuple[State, np.ndarray]:
        data = np.load(path)
        part = {prefix: {k[2:]: jnp.asarray(data[k]) for k in data.files if k.startswith(prefix + "/")}
                for prefix in "pmv"}
        state = cls(part["p"], (part["m"], part["v"]), jnp.asarray(data["count"]), float(data["trained_s"]),
                    int(data["epochs"]))
        return state, data["d2t"]


def train(state: State, shape: HeadShape, embed: jax.Array, train_windows: Windows, held: Windows,
          options: Options, *, seconds: float, seed: int, report: Callable[[str], None],
          checkpoint: Callable[[State], None]) -> State:
    """Epochs over ``train_windows`` until ``seconds`` are spent (the last epoch may be cut short); the
    learning rate warms up, then follows a cosine over the time budget. Reports each epoch's mean loss and
    the held-back acceptance per step."""
    rng = np.random.default_rng(seed + state.epochs)
    spent = 0.0  # training seconds of this run (evaluation not counted)
    while spent < seconds:
        epoch_started = time.perf_counter()
        order = rng.permutation(len(train_windows))
        losses = []
        for start in range(0, len(train_windows), options.batch):
            now = spent + time.perf_counter() - epoch_started
            if now >= seconds:
                break
            lr = options.lr * min(1.0, (int(state.count) + 1) / WARMUP_STEPS)
            lr *= 0.55 + 0.45 * np.cos(np.pi * now / seconds)  # down to a tenth at the end
            batch = train_windows.take(order[start : start + options.batch])
            state.params, state.moments, state.count, loss = _train_step(
                state.params, state.moments, state.count, lr, embed, batch, shape=shape, steps=options.steps,
                decay=options.decay)
            losses.append(float(loss))
        epoch_s = time.perf_counter() - epoch_started
        spent += epoch_s
        state.trained_s += epoch_s
        state.epochs += 1
        started_eval = time.perf_counter()
        accepted = acceptance(state.params, shape, embed, held, options)
        report(f"epoch {state.epochs}: loss {np.mean(losses):.3f} over {len(losses)} batches "
               f"({epoch_s:.0f} s); held-back top-1 per step {' '.join(f'{a:.3f}' for a in accepted)} "
               f"(evaluated in {time.perf_counter() - started_eval:.0f} s)")
        checkpoint(state)
    return state
