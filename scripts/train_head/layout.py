"""llama.cpp's eagle3 GGUF layout (the pinned src/models/eagle3.cpp): which tensors a head carries, their
shapes, and its own header keys. Shared by the trained head's writer and the suite's seeded-random heads
(tests/tiny_models.py), so both write the same file. No JAX here: the suite imports it without the train
extra."""

from __future__ import annotations

import gguf


def default_layers(n_layers: int) -> tuple[int, int, int]:
    """Low, middle and high: the inputs of layers 2, n/2 and n-3, as EAGLE-3's reference code picks them
    (on a target too shallow for those to be in order, the first, middle and last)."""
    if n_layers >= 7:
        return (2, n_layers // 2, n_layers - 3)
    return (0, n_layers // 2, n_layers - 1)


def eagle3_shapes(
    *, n_embd: int, n_head: int, head_dim: int, n_ff: int, n_features: int, draft_vocab: int | None
) -> dict[str, tuple[int, ...]]:
    """Tensor name -> numpy shape (rows, cols) of an EAGLE-3 head of width ``n_embd`` over ``n_features``
    target inputs side by side. Without ``draft_vocab`` it has no output projection (the target's is lent);
    with it, its own over that many tokens and ``d2t``, the target id of each. It never carries token
    embeddings: llama.cpp lends the target's (same width)."""
    attention = n_head * head_dim
    shapes = {
        "fc.weight": (n_embd, n_features),
        "output_norm.weight": (n_embd,),
        "blk.0.attn_norm.weight": (n_embd,),  # on the token embedding
        "blk.0.attn_norm_2.weight": (n_embd,),  # on g
        # q, k and v read the normed token embedding and the normed g side by side, in that order
        "blk.0.attn_q.weight": (attention, 2 * n_embd),
        "blk.0.attn_k.weight": (attention, 2 * n_embd),
        "blk.0.attn_v.weight": (attention, 2 * n_embd),
        "blk.0.attn_output.weight": (n_embd, attention),
        "blk.0.ffn_norm.weight": (n_embd,),
        "blk.0.ffn_gate.weight": (n_ff, n_embd),
        "blk.0.ffn_up.weight": (n_ff, n_embd),
        "blk.0.ffn_down.weight": (n_embd, n_ff),
    }
    if draft_vocab is not None:
        shapes |= {"output.weight": (draft_vocab, n_embd), "d2t": (draft_vocab,)}
    return shapes


def add_head_header(
    writer: gguf.GGUFWriter, *, arch: str, n_ctx: int, n_embd: int, n_ff: int, n_head: int, head_dim: int,
    layers: tuple[int, ...], f16: bool, n_layers: int = 1,
) -> None:
    """What EAGLE-3 and DFlash head files share: ``n_layers`` blocks of the target's width ``n_embd`` with
    their own attention heads (as many for keys as for queries), and the target layers they read."""
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layers)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_array(f"{arch}.target_layers", list(layers))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if f16 else gguf.LlamaFileType.ALL_F32)


def add_eagle3_keys(writer: gguf.GGUFWriter, *, target_hidden: int) -> None:
    """The header keys only an eagle3 file has (beside block count, widths, heads and target_layers)."""
    writer.add_uint32("eagle3.target_hidden_size", target_hidden)
