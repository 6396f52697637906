"""Writes a seeded-random qwen35 GGUF with the published shapes of Qwen3.5-0.8B (or 27B), optionally quantized.

For measuring pass costs of a real-sized hybrid (Gated DeltaNet + attention) model without downloading one:
a pass costs what its shapes and tensor types cost, not what its values are. So the weights are seeded
random (tests/tiny_models.py's writer, with the recurrent decay set so the state stays finite) and the
vocabulary is random too: the published size, made of tiny_models' vocabulary (bytes, letters, a few words)
padded with filler tokens. Its output is gibberish; its speed is the real model's.

Published dimensions used (Qwen/Qwen3.5-0.8B config.json, ``text_config``; read from two public copies of
that file found through the code search index, which agree, and consistent with llama.cpp's
src/models/qwen35.cpp, whose loader names 24 layers of n_embd 1024 "0.8B"):

    vocab_size 248320, hidden_size 1024, intermediate_size 3584, num_hidden_layers 24,
    num_attention_heads 8, num_key_value_heads 2, head_dim 256, full_attention_interval 4,
    linear_num_key_heads 16, linear_num_value_heads 16, linear_key_head_dim 128,
    linear_value_head_dim 128, linear_conv_kernel_dim 4, tie_word_embeddings true, max_position_embeddings 262144,
    partial_rotary_factor 0.25, mrope_section [11, 11, 10].

Qwen3.5-27B / Qwen3.6-27B (``--shape 27b``; the largest dense Qwen3.5/3.6; from public copies of its
config found through the code search index, which agree): hidden_size 5120, intermediate_size 17408,
num_hidden_layers 64, num_attention_heads 24, num_key_value_heads 4, head_dim 256, linear_num_key_heads 16,
linear_num_value_heads 48, linear key/value head dims 128, full_attention_interval 4, tie_word_embeddings
false, mtp_num_hidden_layers 1. Its 64 layers do not fit this machine's disk as float16 before quantizing;
``--layers`` writes fewer of them (scripts/bench/heads.py extrapolates from two depths).

Mapped to GGUF as llama.cpp's converter (conversion/qwen.py) does: ssm.state_size = linear_key_head_dim,
ssm.group_count = linear_num_key_heads, ssm.time_step_rank = linear_num_value_heads, ssm.inner_size =
linear_value_head_dim * linear_num_value_heads. Left out: the config's one multi-token-prediction layer
(mtp_num_hidden_layers 1; llama.cpp skips it in the main pass) and the vision tower.

``--layers`` and ``--embd`` shrink it for quick tests; ``--embd`` scales every width (feed-forward, head and
state sizes) by the same ratio, so the proportions stay Qwen3.5-0.8B's.

    .venv/bin/python -m scripts.models.hybrid qwen35-0.8b-random.gguf
    .venv/bin/python -m scripts.models.hybrid q4.gguf --type Q4_K_M
    .venv/bin/python -m scripts.models.hybrid 27b-4-layers.gguf --shape 27b --layers 4 --type Q4_K_M

Quantizing goes through llama.cpp's own ``llama_model_quantize`` (what llama-quantize calls), as bound by
llama-cpp-python, so no separate llama.cpp build is needed.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from tests.tiny_models import TinySpec, default_vocab, quantize_tiny_model, write_tiny_model

N_VOCAB = 248320
N_LAYERS = 24
N_EMBD = 1024
# Widths that --embd scales with n_embd: intermediate_size, head_dim, linear_key/value_head_dim.
N_FF, HEAD_DIM, SSM_STATE = 3584, 256, 128
# Multiple of n_embd that keeps every scaled width a whole number (and head_dim divisible by 4 for RoPE).
EMBD_STEP = 64
SHAPES = ("0.8b", "27b")


def vocabulary(size: int) -> list[str]:
    base = default_vocab()
    return base + [f"<filler-{i}>" for i in range(size - len(base))]


def qwen35_0_8b_spec(
    *, layers: int = N_LAYERS, embd: int = N_EMBD, vocab: int = N_VOCAB, seed: int = 0
) -> TinySpec:
    if embd % EMBD_STEP or not 0 < layers:
        raise ValueError(f"--embd must be a positive multiple of {EMBD_STEP} and --layers positive")
    if vocab < len(default_vocab()):
        raise ValueError(f"--vocab must be at least {len(default_vocab())}")

    def scaled(width: int) -> int:
        return width * embd // N_EMBD

    return TinySpec(
        architecture="qwen35",
        seed=seed,
        n_layers=layers,
        n_embd=embd,
        n_ff=scaled(N_FF),
        n_head=8,
        n_head_kv=2,
        head_dim=scaled(HEAD_DIM),
        n_ctx=262144,
        full_attention_interval=4,
        conv_kernel=4,
        ssm_state=scaled(SSM_STATE),
        ssm_groups=16,
        ssm_heads=16,
        tie_embeddings=True,
        f16=True,
        tokens=vocabulary(vocab),
    )


def qwen35_27b_spec(*, layers: int = 64, seed: int = 0) -> TinySpec:
    """Qwen3.5-27B's published shapes (the module docstring), ``layers`` deep."""
    if not 0 < layers:
        raise ValueError("--layers must be positive")
    return TinySpec(
        architecture="qwen35",
        seed=seed,
        n_layers=layers,
        n_embd=5120,
        n_ff=17408,
        n_head=24,
        n_head_kv=4,
        head_dim=256,
        n_ctx=262144,
        full_attention_interval=4,
        conv_kernel=4,
        ssm_state=128,
        ssm_groups=16,
        ssm_heads=48,
        tie_embeddings=False,
        f16=True,
        tokens=vocabulary(N_VOCAB),
    )


# The file types llama.cpp's quantizer can be asked for here (llama.h's LLAMA_FTYPE_MOSTLY_*).
QUANT_TYPES = ("Q4_K_M", "Q4_0", "Q8_0", "Q6_K")


def make_hybrid_model(path: Path, spec: TinySpec, *, quant_type: str | None = None) -> Path:
    """Write ``spec`` to ``path`` (f16), quantized to ``quant_type`` if given."""
    if quant_type is None:
        return write_tiny_model(path, spec)
    with tempfile.TemporaryDirectory(prefix="hybrid-f16-", dir=path.parent) as tmp:
        f16 = write_tiny_model(Path(tmp) / "model-f16.gguf", spec)
        try:
            return quantize_tiny_model(f16, path, quant_type, threads=0)
        except RuntimeError as exc:
            raise SystemExit(str(exc)) from exc


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    parser.add_argument("--shape", choices=SHAPES, default="0.8b", help="whose published shapes (default 0.8b)")
    parser.add_argument("--layers", type=int, help=f"default: the model's ({N_LAYERS} for 0.8b, 64 for 27b)")
    parser.add_argument("--embd", type=int, default=N_EMBD, help=f"default {N_EMBD}; other widths follow")
    parser.add_argument("--vocab", type=int, default=N_VOCAB, help=f"default {N_VOCAB}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--type", choices=QUANT_TYPES, help="quantize to this type (default: f16)")
    args = parser.parse_args(argv)
    try:
        if args.shape == "27b":
            spec = qwen35_27b_spec(layers=args.layers or 64, seed=args.seed)
        else:
            spec = qwen35_0_8b_spec(layers=args.layers or N_LAYERS, embd=args.embd, vocab=args.vocab, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    make_hybrid_model(args.out, spec, quant_type=args.type)
    print(args.out)


if __name__ == "__main__":
    main()
