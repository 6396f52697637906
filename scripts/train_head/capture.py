"""What a head learns from, made by localspec's engine on the target: its own greedy answers to prompts, answers
it samples to them (more text of the kind it writes, each position still labelled with its greedy token), and
what it would say at every position of plain text, with the inputs of the three layers the head reads.

A sequence is ``tokens`` c_0..c_L, ``features`` f_0..f_(L-1) (the layer inputs side by side at each
position) and ``labels`` a_0..a_(L-1), a_i the target's greedy token after c_0..c_i; labels from ``first``
on are learnt (an answer's, not its prompt's).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localspec.bench.workloads import BenchPrompt
from localspec.conversation import Conversation
from localspec.engine.decoding.decoder import SpeculativeDecoder
from localspec.engine.decoding.sampling import SamplingParams
from localspec.engine.llama.model import Model

# Temperature of the answers sampled besides the greedy one: varied text the target still writes.
SAMPLE_TEMPERATURE = 0.8
# Text files read from a folder given with --text.
TEXT_SUFFIXES = {".py", ".md", ".txt", ".rst", ".js", ".ts", ".json", ".toml", ".c", ".h", ".cpp", ".rs", ".go",
                 ".java", ".sh", ".html", ".css", ".yaml", ".yml", ".sql"}


@dataclass
class Sequence:
    tokens: np.ndarray  # (L + 1,) int32
    features: np.ndarray  # (L, n_features) float16: half the memory, and more precision than the head needs
    labels: np.ndarray  # (L,) int32
    first: int


class Capture:
    """The target with its layer inputs kept, and a greedy decoder over it (prompt lookup drafts, which
    leaves the answer the target's own and makes it faster to write)."""

    def __init__(self, target: Model, layers: tuple[int, ...]) -> None:
        target.capture_layer_inputs(layers)
        self.target = target
        self.decoder = SpeculativeDecoder(target, method="lookup")

    def answer(self, prompt: BenchPrompt, max_tokens: int, sampling: SamplingParams | None = None) -> Sequence:
        """The target's answer to the first turn of ``prompt``, as a sequence learnt from the answer: greedy,
        or drawn with ``sampling`` and then labelled with the greedy token at every position."""
        conversation = Conversation(self.decoder, system=prompt.system)
        context = conversation.render([{"role": "user", "content": prompt.turns[0]}])
        steps = self.decoder.generate(context, max_tokens=max_tokens, sampling=sampling or SamplingParams())
        answer = [t for step in steps for t in step.tokens]
        full = context + answer
        if sampling is not None:
            return self.text(full, first=len(context) - 1)
        # The decoder's passes wrote the layer inputs of every position the target holds; the last answer
        # token is usually not evaluated, and it is what the position before it is labelled with anyway.
        n = min(len(self.target.tokens), len(full) - 1)
        features = self.target.features[:n].astype(np.float16)
        return Sequence(np.asarray(full[: n + 1], np.int32), features, np.asarray(full[1 : n + 1], np.int32),
                        first=len(context) - 1)

    def text(self, tokens: list[int], first: int = 0) -> Sequence:
        """Text read in one pass: every position is labelled with the target's greedy next token."""
        target = self.target
        target.reset()
        labels = []
        for start in range(0, len(tokens), target.n_batch):
            chunk = tokens[start : start + target.n_batch]
            labels.append(np.argmax(target.eval(chunk, n_logits=len(chunk), prefill=True), axis=-1))
        n = len(tokens) - 1
        return Sequence(np.asarray(tokens, np.int32), target.features[:n].astype(np.float16),
                        np.concatenate(labels)[:n].astype(np.int32), first=first)


def text_files(paths: Iterable[Path]) -> list[Path]:
    """The files given, and the text files under the folders given (sorted, hidden ones left out)."""
    files = []
    for path in paths:
        if path.is_dir():
            files += sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES
                            and not any(part.startswith(".") for part in p.relative_to(path).parts))
        else:
            files.append(path)
    return files


def text_windows(target: Model, files: Iterable[Path], window: int, budget: int) -> Iterable[list[int]]:
    """Token windows of ``window`` tokens (the last of a file shorter) over ``files``, ``budget`` in all."""
    for path in files:
        tokens = target.tokenize(path.read_text(encoding="utf-8", errors="replace"), add_bos=target.add_bos)
        for start in range(0, len(tokens), window):
            piece = tokens[start : start + window]
            if len(piece) < 16 or budget <= 0:
                continue
            budget -= len(piece)
            yield piece


def capture_all(capture: Capture, prompts: list[BenchPrompt], windows: Iterable[list[int]], *, max_tokens: int,
                report: Callable[[str], None], samples: int = 0,
                temperature: float = SAMPLE_TEMPERATURE) -> list[Sequence]:
    """The greedy answer to each prompt and ``samples`` more drawn at ``temperature`` (seeded, so a capture
    made again is the same), then the text windows."""
    sequences = []
    for i, prompt in enumerate(prompts):
        sequences.append(capture.answer(prompt, max_tokens))
        for seed in range(samples):
            sequences.append(capture.answer(prompt, max_tokens, SamplingParams(temperature=temperature, seed=seed)))
        report(f"answered {i + 1}/{len(prompts)} prompts ({sum(len(s.labels) - s.first for s in sequences)} "
               "answer tokens)")
    read = 0
    for window in windows:
        sequences.append(capture.text(window))
        read += len(window)
        report(f"read {read} tokens of text")
    return sequences


def save(path: Path, sequences: list[Sequence]) -> None:
    np.savez(path, tokens=np.concatenate([s.tokens for s in sequences]),
             features=np.concatenate([s.features for s in sequences]),
             labels=np.concatenate([s.labels for s in sequences]),
             lengths=np.asarray([len(s.labels) for s in sequences]), first=np.asarray([s.first for s in sequences]))


def load(path: Path) -> list[Sequence]:
    with np.load(path) as data:  # each item read is the whole array, so each is read once
        tokens, features, labels = data["tokens"], data["features"], data["labels"]
        lengths, firsts = data["lengths"], data["first"]
    sequences, at = [], 0
    for i, (n, first) in enumerate(zip(lengths, firsts)):
        # each sequence has one token more than labels
        sequences.append(Sequence(tokens[at + i : at + i + n + 1], features[at : at + n], labels[at : at + n],
                                  int(first)))
        at += n
    return sequences
