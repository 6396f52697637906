"""Writes tiny GGUF models with the ``gguf`` package, for fast real engine tests.

Architectures: ``llama`` (attention), ``qwen35`` (Gated DeltaNet layers with full attention every
``full_attention_interval``-th layer), ``lfm2`` (short convolutions with the same attention pattern) and
``mamba`` (a pure SSM). All share one vocabulary and chat template, so any two of them pair.

The weights are seeded random float32 (matrices float16 with ``f16``), so greedy output is reproducible.
A draft that agrees with its target only partly is the target's weights plus seeded noise (``perturb``).
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

from scripts.train_head.layout import add_eagle3_keys, add_head_header, eagle3_shapes

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)
# Qwen2.5's tool-calling template (hermes syntax), trimmed of its default system prompt.
QWEN_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\\\"name\\\": \\\"' }}{{- tool_call.name }}{{- '\\\", \\\"arguments\\\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
# Qwen3-Coder's tool-calling template (XML calls), trimmed to the parts that write tools, calls and results.
QWEN3_CODER_TOOLS_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n<function>\\n<name>' + tool.function.name + '</name>\\n<parameters>' }}"
    "{{- tool.function.parameters | tojson }}{{- '</parameters>\\n</function>' }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nTo call a function, reply in this format:\\n<tool_call>\\n<function=NAME>\\n"
    "<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call><|im_end|>\\n' }}"
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls %}{{- '<tool_call>\\n<function=' + call.function.name + '>\\n' }}"
    "{%- for key, value in call.function.arguments | items %}{{- '<parameter=' + key + '>\\n' }}"
    "{{- value | tojson if value is mapping or (value is sequence and value is not string) else value | string }}"
    "{{- '\\n</parameter>\\n' }}{%- endfor %}{{- '</function>\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
WORDS = ["▁the", "▁def", "▁return", "▁hello", "▁world", "▁code", "▁print", "▁x", "▁=", "▁+"]
LETTERS = list("abcdefghijklmnopqrstuvwxyz") + ["▁"]


# Qwen2.5-Coder's fill-in-the-middle tokens, by the GGUF key naming each (llama.cpp also finds them by text).
FIM_TOKENS = {
    "tokenizer.ggml.fim_pre_token_id": "<|fim_prefix|>",
    "tokenizer.ggml.fim_suf_token_id": "<|fim_suffix|>",
    "tokenizer.ggml.fim_mid_token_id": "<|fim_middle|>",
    "tokenizer.ggml.fim_pad_token_id": "<|fim_pad|>",
    "tokenizer.ggml.fim_rep_token_id": "<|repo_name|>",
    "tokenizer.ggml.fim_sep_token_id": "<|file_sep|>",
}
# The repo-level tokens, which only some FIM models have.
REPO_LEVEL_KEYS = ("tokenizer.ggml.fim_rep_token_id", "tokenizer.ggml.fim_sep_token_id")


def default_vocab() -> list[str]:
    return ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + LETTERS + WORDS


def fim_fields(*, repo_level: bool = True, keys: bool = True) -> dict:
    """TinySpec fields of a vocabulary with FIM tokens after the default ones, their ids in the GGUF's keys
    (``keys=False``: no keys, so llama.cpp finds them by their text); ``repo_level=False`` leaves out the
    repo-level tokens."""
    chosen = {key: text for key, text in FIM_TOKENS.items() if repo_level or key not in REPO_LEVEL_KEYS}
    tokens = default_vocab() + list(chosen.values())
    extra = {key: tokens.index(text) for key, text in chosen.items()} if keys else {}
    return {"tokens": tokens, "extra": extra}


@dataclass
class TinySpec:
    """What to vary between test models; defaults give a valid, loadable model."""

    architecture: str = "llama"
    seed: int = 0
    n_layers: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 128
    n_ctx: int = 2048
    # Grouped-query attention and wider heads (Qwen3.5 has both); None: one KV head per head, n_embd/n_head.
    n_head_kv: int | None = None
    head_dim: int | None = None
    # Hybrids (qwen35, lfm2): every full_attention_interval-th layer is attention, the others recurrent.
    full_attention_interval: int = 2
    # Recurrent layers: convolution width (all three), state size per head (qwen35, mamba), and qwen35's
    # key heads (ssm_groups) and value heads (ssm_heads).
    conv_kernel: int = 4
    ssm_state: int = 16
    ssm_groups: int = 2
    ssm_heads: int = 4
    # The output projection reuses the token embeddings (no output.weight, so no logit_scale), as small
    # Qwen3.5 models do.
    tie_embeddings: bool = False
    # Matrices stored as float16, as converted checkpoints are; norms, biases and conv kernels stay float32.
    f16: bool = False
    # Larger output weights give peakier next-token distributions (useful for sampling tests).
    logit_scale: float = 1.0
    perturb_seed: int | None = None
    perturb_scale: float = 0.0
    tokens: list[str] = field(default_factory=default_vocab)
    token_types: list[int] | None = None
    tokenizer_model: str = "llama"
    bos_id: int = 1
    eos_id: int = 2
    chat_template: str | None = CHAT_TEMPLATE
    # BPE merges ("a b" rules) and the pre-tokenizer name; left out of the file when None.
    merges: list[str] | None = None
    # SentencePiece scores (which merge wins); default -id, so earlier tokens win.
    scores: list[float] | None = None
    pre_tokenizer: str | None = None
    # Extra metadata, e.g. {"tokenizer.ggml.eot_token_id": 2}; values are written with their Python type.
    extra: dict = field(default_factory=dict)
    # Mixture-of-experts feed-forward (qwen35moe, qwen3moe): experts per layer, experts each token uses,
    # and one expert's width (qwen35moe adds a shared expert of that width too).
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_expert: int = 0
    # qwen35 only: a multi-token-prediction (MTP, "nextn") block after the trunk, as Qwen3.5/3.6 ship it
    # (block_count = n_layers + 1, nextn_predict_layers = 1); llama.cpp loads it with load_mtp.
    mtp: bool = False
    # The trunk layers' output projections scaled by this: at 0 they add nothing and the target predicts
    # the next token from the current one alone (a bigram model); small values keep it mostly so.
    trunk_scale: float = 1.0
    # A head whose block adds nothing and whose eh_proj passes the token embedding through: it predicts
    # the bigram model's next token, so with trunk_scale 0 every greedy draft is accepted by construction,
    # and with a small trunk_scale most are (the rest roll back).
    mtp_agrees: bool = False
    # A head that passes the target's hidden state through instead: with trunk_scale 0 that state is the
    # one that predicted the head's input token, so the head guesses that token again (an echo that shows
    # it was given the right hidden state).
    mtp_echoes: bool = False
    # With trunk_scale 0, rules "token text -> the text of the token predicted after it" (by a wide margin),
    # so a test can have the model write what it needs, such as lines of a given indentation.
    next_tokens: dict[str, str] = field(default_factory=dict)


def _types_for(tokens: list[str]) -> list[int]:
    types = []
    for i, text in enumerate(tokens):
        if text.startswith("<0x") and len(text) == 6:
            types.append(gguf.TokenType.BYTE)
        elif text in ("<s>", "</s>") or text in FIM_TOKENS.values():
            types.append(gguf.TokenType.CONTROL)
        elif text == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        else:
            types.append(gguf.TokenType.NORMAL)
    return types


HYBRIDS = ("qwen35", "lfm2")
# Mixture-of-experts variants, each laid out as a dense architecture with an expert feed-forward.
MOE_LAYOUTS = {"qwen35moe": "qwen35", "qwen3moe": "llama"}
ARCHITECTURES = ("llama", *HYBRIDS, "mamba", *MOE_LAYOUTS)

Matrix = Callable[..., np.ndarray]


def _layout(spec: TinySpec) -> str:
    return MOE_LAYOUTS.get(spec.architecture, spec.architecture)


def _is_attention_layer(spec: TinySpec, layer: int) -> bool:
    if _layout(spec) == "llama":
        return True
    if spec.architecture == "mamba":
        return False
    return (layer + 1) % spec.full_attention_interval == 0


def _head_dim(spec: TinySpec) -> int:
    return spec.head_dim or spec.n_embd // spec.n_head


def _n_head_kv(spec: TinySpec) -> int:
    return spec.n_head_kv or spec.n_head


def _ones(n: int) -> np.ndarray:
    return np.ones(n, dtype=np.float32)


def _attention(spec: TinySpec, mat: Matrix) -> dict[str, np.ndarray]:
    d, head_dim = spec.n_embd, _head_dim(spec)
    # Qwen3.5 projects a sigmoid output gate alongside each query head.
    q_rows = spec.n_head * head_dim * (2 if _layout(spec) == "qwen35" else 1)
    kv_rows = _n_head_kv(spec) * head_dim
    tensors = {
        "attn_q.weight": mat(q_rows, d),
        "attn_k.weight": mat(kv_rows, d),
        "attn_v.weight": mat(kv_rows, d),
        "attn_output.weight": mat(d, spec.n_head * head_dim),
    }
    if _layout(spec) in HYBRIDS or spec.architecture == "qwen3moe":
        tensors |= {"attn_q_norm.weight": _ones(head_dim), "attn_k_norm.weight": _ones(head_dim)}
    return tensors


def _gated_delta_net(spec: TinySpec, mat: Matrix) -> dict[str, np.ndarray]:
    d, heads = spec.n_embd, spec.ssm_heads
    key_dim, value_dim = spec.ssm_state * spec.ssm_groups, spec.ssm_state * heads
    conv_dim = 2 * key_dim + value_dim
    return {
        "attn_qkv.weight": mat(conv_dim, d),
        "attn_gate.weight": mat(value_dim, d),
        "ssm_conv1d.weight": mat(conv_dim, spec.conv_kernel, 0.3),
        # Qwen3.5's initial dt_bias; the decay A (stored as -exp(A_log)) must be negative, or the state
        # blows up.
        "ssm_dt.bias": _ones(heads),
        "ssm_a": -np.linspace(1.0, 8.0, heads, dtype=np.float32),
        "ssm_beta.weight": mat(heads, d),
        "ssm_alpha.weight": mat(heads, d),
        "ssm_norm.weight": _ones(spec.ssm_state),
        "ssm_out.weight": mat(d, value_dim),
    }


def _short_conv(spec: TinySpec, mat: Matrix) -> dict[str, np.ndarray]:
    d = spec.n_embd
    return {
        "shortconv.conv.weight": mat(d, spec.conv_kernel, 0.3),
        "shortconv.in_proj.weight": mat(3 * d, d),
        "shortconv.out_proj.weight": mat(d, d),
    }


def _mamba_dims(spec: TinySpec) -> tuple[int, int]:
    """(inner size, time-step rank): llama.cpp takes only Mamba's expansion factor 2; rank is ceil(d/16)."""
    return 2 * spec.n_embd, -(-spec.n_embd // 16)


def _mamba_ssm(spec: TinySpec, mat: Matrix) -> dict[str, np.ndarray]:
    d, n = spec.n_embd, spec.ssm_state
    d_inner, dt_rank = _mamba_dims(spec)
    # Mamba's initial step sizes span 0.001..0.1 (the bias is their inverse softplus) and A is S4D-real's
    # -1..-n per channel: the state then decays instead of growing.
    step = np.geomspace(1e-3, 1e-1, d_inner)
    return {
        "ssm_in.weight": mat(2 * d_inner, d),
        "ssm_conv1d.weight": mat(d_inner, spec.conv_kernel, 0.3),
        "ssm_conv1d.bias": np.zeros(d_inner, dtype=np.float32),
        "ssm_x.weight": mat(dt_rank + 2 * n, d_inner),
        "ssm_dt.weight": mat(d_inner, dt_rank),
        "ssm_dt.bias": np.log(np.expm1(step)).astype(np.float32),
        "ssm_a": -np.tile(np.arange(1, n + 1, dtype=np.float32), (d_inner, 1)),
        "ssm_d": _ones(d_inner),
        "ssm_out.weight": mat(d, d_inner),
    }


RECURRENT_MIXERS: dict[str, Callable[[TinySpec, Matrix], dict[str, np.ndarray]]] = {
    "qwen35": _gated_delta_net,
    "lfm2": _short_conv,
    "mamba": _mamba_ssm,
}


def _feed_forward(spec: TinySpec, mat: Matrix) -> dict[str, np.ndarray]:
    d, ff = spec.n_embd, spec.n_ff
    norm = "post_attention_norm.weight" if _layout(spec) == "qwen35" else "ffn_norm.weight"
    if spec.n_expert:
        return {norm: _ones(d)} | _experts(spec, mat)
    return {
        norm: _ones(d),
        "ffn_gate.weight": mat(ff, d),
        "ffn_up.weight": mat(ff, d),
        "ffn_down.weight": mat(d, ff),
    }


def _experts(spec: TinySpec, mat: Matrix) -> dict[str, np.ndarray]:
    d, ff, n = spec.n_embd, spec.n_ff_expert, spec.n_expert
    tensors = {
        "ffn_gate_inp.weight": mat(n, d),
        "ffn_gate_exps.weight": np.stack([mat(ff, d) for _ in range(n)]),
        "ffn_up_exps.weight": np.stack([mat(ff, d) for _ in range(n)]),
        "ffn_down_exps.weight": np.stack([mat(d, ff) for _ in range(n)]),
    }
    if spec.architecture == "qwen35moe":
        tensors |= {
            "ffn_gate_inp_shexp.weight": mat(1, d)[0],
            "ffn_gate_shexp.weight": mat(ff, d),
            "ffn_up_shexp.weight": mat(ff, d),
            "ffn_down_shexp.weight": mat(d, ff),
        }
    return tensors


def _weights(spec: TinySpec) -> Iterator[tuple[str, np.ndarray]]:
    """(name, array) in file order, a block at a time, so a model at real shapes (256 experts a layer) is
    never whole in memory; the random draws come in the same order as ever, so a seed's weights stay the same."""
    n_vocab, d = len(spec.tokens), spec.n_embd
    rng = np.random.default_rng(spec.seed)
    noise = np.random.default_rng(spec.perturb_seed) if spec.perturb_seed is not None else None

    def mat(rows: int, cols: int, scale: float = 0.08) -> np.ndarray:
        w = rng.normal(0.0, scale, size=(rows, cols)).astype(np.float32)
        if noise is not None:
            w += noise.normal(0.0, scale * spec.perturb_scale, size=(rows, cols)).astype(np.float32)
        return w

    # llama.cpp reads LFM2's final norm under this name.
    output_norm = "token_embd_norm.weight" if spec.architecture == "lfm2" else "output_norm.weight"
    embeddings = mat(n_vocab, d, 1.0)
    yield "token_embd.weight", embeddings
    yield output_norm, _ones(d)
    if not spec.tie_embeddings:
        yield "output.weight", _with_next_tokens(spec, embeddings, mat(n_vocab, d, 0.15 * spec.logit_scale))
    for i in range(spec.n_layers):
        if _is_attention_layer(spec, i):
            mixer = _attention(spec, mat)
        else:
            mixer = RECURRENT_MIXERS[_layout(spec)](spec, mat)
        # Mamba blocks are the SSM alone, without a feed-forward.
        ffn = _feed_forward(spec, mat) if spec.architecture != "mamba" else {}
        block = {"attn_norm.weight": _ones(d)} | mixer | ffn
        if spec.trunk_scale != 1.0:
            block = _scaled(block, spec.trunk_scale)
        yield from ((f"blk.{i}.{name}", array) for name, array in block.items())
    if spec.mtp:
        yield from ((f"blk.{spec.n_layers}.{name}", array) for name, array in _mtp_block(spec, mat).items())


# How far a rule of TinySpec.next_tokens lifts its token's logit.
NEXT_TOKEN_LOGIT = 30.0


def _with_next_tokens(spec: TinySpec, embeddings: np.ndarray, output: np.ndarray) -> np.ndarray:
    """``output`` with the rules of ``spec.next_tokens`` written into it: with the trunk scaled to 0, the last
    hidden state of a token is its embedding, RMS-normalized, so a row along it lifts that row's token."""
    for current, following in spec.next_tokens.items():
        hidden = embeddings[spec.tokens.index(current)]
        hidden = hidden / np.sqrt(np.mean(hidden**2))
        output[spec.tokens.index(following)] += NEXT_TOKEN_LOGIT * hidden / (hidden @ hidden)
    return output


# The projections that write a block's contribution into the residual stream.
_BLOCK_OUTPUTS = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight")


def _scaled(block: dict[str, np.ndarray], scale: float) -> dict[str, np.ndarray]:
    return {name: a * np.float32(scale) if name in _BLOCK_OUTPUTS else a for name, a in block.items()}


def _mtp_block(spec: TinySpec, mat: Matrix) -> dict[str, np.ndarray]:
    """Qwen3.5's MTP block: a full-attention block fed eh_proj([enorm(embed(token)), hnorm(hidden)])."""
    d = spec.n_embd
    block = {"attn_norm.weight": _ones(d)} | _attention(spec, mat) | _feed_forward(spec, mat)
    eh_proj = mat(d, 2 * d)
    if spec.mtp_agrees or spec.mtp_echoes:
        block = _scaled(block, 0.0)
        passed = [np.eye(d, dtype=np.float32), np.zeros((d, d), dtype=np.float32)]
        eh_proj = np.hstack(passed[::-1] if spec.mtp_echoes else passed)
    return block | {"nextn.eh_proj.weight": eh_proj, "nextn.enorm.weight": _ones(d), "nextn.hnorm.weight": _ones(d)}


def _add_attention_hparams(writer: gguf.GGUFWriter, spec: TinySpec, n_head_kv: int | list[int]) -> None:
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(n_head_kv)
    if spec.head_dim is not None:
        writer.add_key_length(spec.head_dim)
        writer.add_value_length(spec.head_dim)


def _llama_hparams(writer: gguf.GGUFWriter, spec: TinySpec) -> None:
    _add_attention_hparams(writer, spec, _n_head_kv(spec))
    writer.add_rope_dimension_count(_head_dim(spec))


def _qwen35_hparams(writer: gguf.GGUFWriter, spec: TinySpec) -> None:
    _add_attention_hparams(writer, spec, _n_head_kv(spec))
    # Qwen3.5 rotates a quarter of each head (partial_rotary_factor 0.25), in interleaved M-RoPE sections of
    # its proportions (11, 11, 10 of 32 pairs).
    n_rot = _head_dim(spec) // 4
    third = -(-n_rot // 6)
    writer.add_rope_dimension_count(n_rot)
    writer.add_rope_dimension_sections([third, third, n_rot // 2 - 2 * third, 0])
    writer.add_ssm_conv_kernel(spec.conv_kernel)
    writer.add_ssm_state_size(spec.ssm_state)
    writer.add_ssm_group_count(spec.ssm_groups)
    writer.add_ssm_time_step_rank(spec.ssm_heads)
    writer.add_ssm_inner_size(spec.ssm_state * spec.ssm_heads)
    writer.add_full_attention_interval(spec.full_attention_interval)


def _lfm2_hparams(writer: gguf.GGUFWriter, spec: TinySpec) -> None:
    # LFM2 marks its convolution layers by giving them no KV heads.
    heads_kv = [_n_head_kv(spec) if _is_attention_layer(spec, i) else 0 for i in range(spec.n_layers)]
    _add_attention_hparams(writer, spec, heads_kv)
    writer.add_shortconv_l_cache(spec.conv_kernel)


def _mamba_hparams(writer: gguf.GGUFWriter, spec: TinySpec) -> None:
    d_inner, dt_rank = _mamba_dims(spec)
    writer.add_ssm_conv_kernel(spec.conv_kernel)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(spec.ssm_state)
    writer.add_ssm_time_step_rank(dt_rank)


def _expert_hparams(writer: gguf.GGUFWriter, spec: TinySpec) -> None:
    HPARAM_WRITERS[_layout(spec)](writer, spec)
    writer.add_expert_count(spec.n_expert)
    writer.add_expert_used_count(spec.n_expert_used)
    writer.add_expert_feed_forward_length(spec.n_ff_expert)
    if spec.architecture == "qwen35moe":
        writer.add_expert_shared_feed_forward_length(spec.n_ff_expert)


HPARAM_WRITERS: dict[str, Callable[[gguf.GGUFWriter, TinySpec], None]] = {
    "llama": _llama_hparams,
    "qwen35": _qwen35_hparams,
    "lfm2": _lfm2_hparams,
    "mamba": _mamba_hparams,
    **dict.fromkeys(MOE_LAYOUTS, _expert_hparams),
}


def _stored(name: str, array: np.ndarray, f16: bool) -> np.ndarray:
    # As converters do: llama.cpp's kernels expect 1-D tensors and convolution kernels in float32.
    if f16 and array.ndim >= 2 and name.endswith(".weight") and "conv" not in name:
        return array.astype(np.float16)
    return array


def _add_tokenizer(writer: gguf.GGUFWriter, spec: TinySpec) -> None:
    """The tokenizer and chat template of ``spec`` (a companion head carries its target's)."""
    writer.add_tokenizer_model(spec.tokenizer_model)
    if spec.pre_tokenizer is not None:
        writer.add_tokenizer_pre(spec.pre_tokenizer)
    writer.add_token_list(spec.tokens)
    writer.add_token_scores(spec.scores or [-float(i) for i in range(len(spec.tokens))])
    writer.add_token_types(spec.token_types or _types_for(spec.tokens))
    if spec.merges is not None:
        writer.add_token_merges(spec.merges)
    writer.add_bos_token_id(spec.bos_id)
    writer.add_eos_token_id(spec.eos_id)
    writer.add_unk_token_id(0)
    if spec.chat_template is not None:
        writer.add_chat_template(spec.chat_template)


def write_tiny_model(path: Path, spec: TinySpec | None = None) -> Path:
    spec = spec or TinySpec()
    if spec.architecture not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {spec.architecture!r}; one of {ARCHITECTURES}")
    # Each tensor goes to a temporary file as it is made (gguf's own spooling), not into memory.
    writer = gguf.GGUFWriter(str(path), spec.architecture, use_temp_file=True)
    writer.add_name(f"tiny-{spec.seed}")
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layers + spec.mtp)
    HPARAM_WRITERS[spec.architecture](writer, spec)
    if spec.mtp:
        if _layout(spec) != "qwen35":
            raise ValueError("an MTP block is written for qwen35 and qwen35moe only")
        writer.add_uint32(f"{spec.architecture}.nextn_predict_layers", 1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.f16 else gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(writer, spec)
    for key, value in spec.extra.items():
        _add_value(writer, key, value)
    _write_out(writer, _weights(spec), spec.f16)
    return path


def _write_out(writer: gguf.GGUFWriter, tensors, f16: bool) -> None:
    """Add ``tensors`` ((name, array) pairs) as converters store them, and write the file."""
    for name, array in tensors:
        writer.add_tensor(name, _stored(name, array, f16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _head_writer(
    path: Path, arch: str, target: TinySpec, layers: tuple[int, ...], *, seed: int, n_layers: int
) -> gguf.GGUFWriter:
    """A companion head file's writer with what EAGLE-3 and DFlash heads share: ``n_layers`` blocks of the
    target's width with their own attention heads, the target layers read, and the target's tokenizer."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_name(f"tiny-{arch}-{seed}")
    add_head_header(writer, arch=arch, n_ctx=target.n_ctx, n_embd=target.n_embd, n_ff=target.n_ff,
                    n_head=target.n_head, head_dim=target.n_embd // target.n_head, layers=layers, f16=target.f16,
                    n_layers=n_layers)
    _add_tokenizer(writer, target)
    return writer


def _random_matrices(seed: int):
    """mat(rows, cols, scale): a head's seeded-random float32 matrices, drawn in call order."""
    rng = np.random.default_rng(seed)

    def mat(rows: int, cols: int, scale: float = 0.08) -> np.ndarray:
        return rng.normal(0.0, scale, size=(rows, cols)).astype(np.float32)

    return mat


def write_tiny_eagle3_head(
    path: Path, target: TinySpec, layers: tuple[int, ...], *, seed: int = 7, draft_vocab: int | None = None
) -> Path:
    """An EAGLE-3 head for ``target`` (llama.cpp's eagle3 architecture): one decoder block over the token
    embedding and g, g = fc(the inputs of target ``layers`` side by side), random weights, and the target's
    tokenizer, as converted heads carry it. It has no embeddings of its own (llama.cpp lends the target's,
    same width). Its output projection is the target's too, or with ``draft_vocab`` its own over the first
    that many target tokens, mapped back by ``d2t`` (published heads draft from a 32k-token vocabulary)."""
    d, n_head = target.n_embd, target.n_head
    head_dim = d // n_head  # its own attention, whatever the target's
    writer = _head_writer(path, "eagle3", target, layers, seed=seed, n_layers=1)
    add_eagle3_keys(writer, target_hidden=d)
    mat = _random_matrices(seed)
    shapes = eagle3_shapes(n_embd=d, n_head=n_head, head_dim=head_dim, n_ff=target.n_ff,
                           n_features=len(layers) * d, draft_vocab=draft_vocab)
    tensors = {}
    for name, shape in shapes.items():  # matrices drawn in layout order
        if name == "d2t":
            tensors[name] = np.arange(draft_vocab, dtype=np.int64)
        elif len(shape) == 1:
            tensors[name] = _ones(shape[0])
        else:
            tensors[name] = mat(*shape, 0.15 * target.logit_scale) if name == "output.weight" else mat(*shape)
    _write_out(writer, tensors.items(), target.f16)
    return path


def write_tiny_dflash_head(
    path: Path, target: TinySpec, layers: tuple[int, ...], *, seed: int = 7, n_layers: int = 2,
    block_size: int = 8, extra: dict | None = None,
) -> Path:
    """A DFlash head for ``target`` (llama.cpp's dflash architecture): ``n_layers`` blocks whose keys and
    values over the context come from fc(the inputs of target ``layers`` side by side), random weights, and
    the target's tokenizer with its last token as the mask token, as converted heads carry them. Embeddings
    and output projection are the target's (lent by llama.cpp). ``extra``: more header keys (a variant's)."""
    d, n_head, ff = target.n_embd, target.n_head, target.n_ff
    head_dim = d // n_head
    writer = _head_writer(path, "dflash", target, layers, seed=seed, n_layers=n_layers)
    writer.add_uint32("dflash.block_size", block_size)
    for key, value in (extra or {}).items():
        _add_value(writer, key, value)
    writer.add_mask_token_id(len(target.tokens) - 1)
    mat = _random_matrices(seed)

    tensors = {"fc.weight": mat(d, len(layers) * d), "enc.output_norm.weight": _ones(d), "output_norm.weight": _ones(d)}
    for i in range(n_layers):
        tensors |= {
            f"blk.{i}.attn_norm.weight": _ones(d),
            f"blk.{i}.attn_q.weight": mat(n_head * head_dim, d),
            f"blk.{i}.attn_k.weight": mat(n_head * head_dim, d),
            f"blk.{i}.attn_v.weight": mat(n_head * head_dim, d),
            f"blk.{i}.attn_output.weight": mat(d, n_head * head_dim),
            f"blk.{i}.attn_q_norm.weight": _ones(head_dim),
            f"blk.{i}.attn_k_norm.weight": _ones(head_dim),
            f"blk.{i}.ffn_norm.weight": _ones(d),
            f"blk.{i}.ffn_gate.weight": mat(ff, d),
            f"blk.{i}.ffn_up.weight": mat(ff, d),
            f"blk.{i}.ffn_down.weight": mat(d, ff),
        }
    _write_out(writer, tensors.items(), target.f16)
    return path


def tiny_model_bytes(spec: TinySpec | None = None) -> bytes:
    """A tiny model's file contents, for serving it from a fake index or Hub."""
    with tempfile.TemporaryDirectory(prefix="tiny-model-") as tmp:
        return write_tiny_model(Path(tmp) / "model.gguf", spec).read_bytes()


def _add_value(writer: gguf.GGUFWriter, key: str, value) -> None:
    if isinstance(value, bool):
        writer.add_bool(key, value)
    elif isinstance(value, int):
        writer.add_uint32(key, value)
    elif isinstance(value, float):
        writer.add_float32(key, value)
    elif isinstance(value, str):
        writer.add_string(key, value)
    else:
        writer.add_array(key, list(value))


def quantize_tiny_model(source: Path, path: Path, ftype: str, *, threads: int = 1) -> Path:
    """``source`` quantized by llama.cpp's own quantizer to ``ftype`` ("Q4_K_M", "Q6_K", ...: a
    ``LLAMA_FTYPE_MOSTLY_*`` name), as real GGUFs are, on ``threads`` threads (0: every core). K-quants need
    rows of a multiple of 256 columns."""
    from localspec.engine.llama.library import load_llama_cpp

    llama_cpp = load_llama_cpp()  # its log quiet unless LOCALSPEC_DEBUG is set
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads
    if llama_cpp.llama_model_quantize(str(source).encode(), str(path).encode(), ctypes.byref(params)) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {ftype}")
    return path
