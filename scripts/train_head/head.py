"""The EAGLE-3 head's forward pass in JAX, op for op as the pinned llama.cpp computes it (src/models/eagle3.cpp,
ggml's rope in its NORM mode), and its training loss with EAGLE-3's training-time test.

Sequence layout, as localspec's and llama.cpp's drafting loops build the head's entries: for a context
c_0..c_n with the target's layer inputs f_0..f_n, entry e is built from the token c_(e+1) and g_e = fc(f_e),
at position e, and predicts the token after c_(e+1). A chained step k >= 1 builds the entry at position e + k
from the next token and, as g, the head's own state (its output before the final norm) of step k - 1; it
attends to the entries 0..e that came from the target and to its own chain at e + 1..e + k.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from scripts.train_head.layout import eagle3_shapes

# ggml's default when a file names none (llama-model.cpp); the writer leaves the key out to match.
ROPE_BASE = 10000.0
RMS_EPS = 1e-5  # layout.add_head_header writes this


@dataclass(frozen=True)
class HeadShape:
    n_embd: int
    n_head: int
    head_dim: int
    n_ff: int
    n_features: int
    draft_vocab: int

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return eagle3_shapes(n_embd=self.n_embd, n_head=self.n_head, head_dim=self.head_dim, n_ff=self.n_ff,
                             n_features=self.n_features, draft_vocab=self.draft_vocab)


def init_params(shape: HeadShape, output_norm: np.ndarray, output: np.ndarray, seed: int) -> dict[str, jax.Array]:
    """Trainable weights: matrices drawn at 1/sqrt(fan-in), norms at one; the output norm and projection
    start as the target's own (its rows for the draft vocabulary), so the head starts out speaking the
    target's language. ``d2t`` is not a weight: the writer adds it."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, dims in shape.shapes().items():
        if name in ("d2t", "output.weight"):
            continue
        if len(dims) == 1:
            params[name] = np.ones(dims, np.float32)
        else:
            params[name] = rng.normal(0.0, dims[1] ** -0.5, size=dims).astype(np.float32)
    params["output_norm.weight"] = output_norm.astype(np.float32)
    params["output.weight"] = output.astype(np.float32)
    return {name: jnp.asarray(value) for name, value in params.items()}


def rms_norm(x: jax.Array, weight: jax.Array) -> jax.Array:
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + RMS_EPS) * weight


def rope(x: jax.Array, positions: jax.Array) -> jax.Array:
    """ggml_rope_ext in NORM mode (eagle3's rope type): dimension pairs (2i, 2i + 1) turned by
    position * base^(-2i / head_dim). ``x``: (..., T, heads, head_dim), ``positions``: (T,)."""
    half = x.shape[-1] // 2
    angles = positions[:, None].astype(jnp.float32) * ROPE_BASE ** (-2.0 * jnp.arange(half) / x.shape[-1])
    cos, sin = jnp.cos(angles)[:, None, :], jnp.sin(angles)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return jnp.stack([x0 * cos - x1 * sin, x0 * sin + x1 * cos], axis=-1).reshape(x.shape)


def _qkv(params, shape: HeadShape, emb: jax.Array, g: jax.Array, positions: jax.Array):
    """q, k, v of entries built from token embeddings ``emb`` and states ``g`` (B, T, n_embd): the two
    normed apart and read side by side, embedding first; q and k turned to ``positions``."""
    x = jnp.concatenate([rms_norm(emb, params["blk.0.attn_norm.weight"]),
                         rms_norm(g, params["blk.0.attn_norm_2.weight"])], axis=-1)
    split = (*x.shape[:-1], shape.n_head, shape.head_dim)
    q = (x @ params["blk.0.attn_q.weight"].T).reshape(split)
    k = (x @ params["blk.0.attn_k.weight"].T).reshape(split)
    v = (x @ params["blk.0.attn_v.weight"].T).reshape(split)
    return rope(q, positions), rope(k, positions), v


def _state(params, attended: jax.Array, g: jax.Array) -> jax.Array:
    """The head's state (llama.cpp's t_h_nextn) from the attention's output: the residual is the raw g
    (norm_before_residual is off), then a SwiGLU feed-forward with its own residual."""
    b, t = attended.shape[:2]
    ffn_in = attended.reshape(b, t, -1) @ params["blk.0.attn_output.weight"].T + g
    x = rms_norm(ffn_in, params["blk.0.ffn_norm.weight"])
    gate = jax.nn.silu(x @ params["blk.0.ffn_gate.weight"].T) * (x @ params["blk.0.ffn_up.weight"].T)
    return gate @ params["blk.0.ffn_down.weight"].T + ffn_in


def draft_logits(params, state: jax.Array) -> jax.Array:
    """Logits over the draft vocabulary (llama.cpp writes them to the target ids ``d2t`` names)."""
    return rms_norm(state, params["output_norm.weight"]) @ params["output.weight"].T


def chained_forward(params, shape: HeadShape, embed: jax.Array, tokens: jax.Array, features: jax.Array,
                    steps: int) -> list[tuple[jax.Array, jax.Array]]:
    """(state, draft logits) of each step 0..steps - 1 at every base entry e, each (B, T, ...).

    ``tokens`` (B, T + steps - 1): the token each entry is built from (tokens[e + k] at step k);
    ``features`` (B, T, n_features): the target's layer inputs of the entries' g. ``embed``: the target's
    token embeddings (lent to the head, as llama.cpp does).
    """
    t = features.shape[1]
    scale = shape.head_dim ** -0.5
    g = features @ params["fc.weight"].T
    causal = jnp.tril(jnp.ones((t, t), bool))
    base = jnp.arange(t)
    keys, values, outputs = None, [], []
    for k in range(steps):
        q, key, value = _qkv(params, shape, embed[tokens[:, k : k + t]], g, base + k)
        if keys is None:
            keys, values = key, [value]  # the target-fed entries: every later step attends to them causally
            diagonal = []
        else:
            diagonal.append(key)
            values.append(value)
        scores = [jnp.where(causal, jnp.einsum("bqhd,bkhd->bhqk", q, keys) * scale, -jnp.inf)]
        scores += [jnp.einsum("bqhd,bqhd->bhq", q, own)[..., None] * scale for own in diagonal]
        weights = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1)
        attended = jnp.einsum("bhqk,bkhd->bqhd", weights[..., :t], values[0])
        for j, own in enumerate(values[1:]):
            attended = attended + weights[..., t + j].transpose(0, 2, 1)[..., None] * own
        state = _state(params, attended, g)
        outputs.append((state, draft_logits(params, state)))
        g = state  # the next step reads the head's own state where the target's is not known yet
    return outputs


def ttt_loss(params, shape: HeadShape, embed, tokens, features, labels, mask, steps: int, decay: float):
    """EAGLE-3's training-time test: the cross-entropy of every chained step (weights decay^k) against
    ``labels`` (B, T + steps - 1, draft ids, -1 for a token outside the draft vocabulary; step k at base e is
    judged by labels[e + k]) where ``mask``."""
    t = features.shape[1]
    total, weight = 0.0, 0.0
    for k, (_, logits) in enumerate(chained_forward(params, shape, embed, tokens, features, steps)):
        step_labels = labels[:, k : k + t]
        m = mask[:, k : k + t] * (step_labels >= 0)  # a token the head cannot draft teaches it nothing
        picked = jnp.maximum(step_labels, 0)[..., None]
        nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), picked, axis=-1)[..., 0]
        total += decay**k * jnp.sum(nll * m) / jnp.maximum(jnp.sum(m), 1.0)
        weight += decay**k
    return total / weight


def top1_hits(params, shape: HeadShape, embed, tokens, features, labels, mask, steps: int) -> jax.Array:
    """(steps, 2): per step, the masked positions whose draft argmax is the label (never one outside the
    draft vocabulary), and the masked positions."""
    t = features.shape[1]
    out = []
    for k, (_, logits) in enumerate(chained_forward(params, shape, embed, tokens, features, steps)):
        m = mask[:, k : k + t]
        out.append(jnp.stack([jnp.sum((jnp.argmax(logits, -1) == labels[:, k : k + t]) * m), jnp.sum(m)]))
    return jnp.stack(out)
