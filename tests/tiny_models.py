"""Writes tiny llama-architecture GGUF models with the ``gguf`` package, for fast real engine tests.

The weights are seeded random float32, so greedy output is reproducible. A draft that agrees with its
target only partly is the target's weights plus seeded noise (``perturb``).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

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
WORDS = ["▁the", "▁def", "▁return", "▁hello", "▁world", "▁code", "▁print", "▁x", "▁=", "▁+"]
LETTERS = list("abcdefghijklmnopqrstuvwxyz") + ["▁"]


def default_vocab() -> list[str]:
    return ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + LETTERS + WORDS


@dataclass
class TinySpec:
    """What to vary between test models; defaults give a valid, loadable model."""

    seed: int = 0
    n_layers: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 128
    n_ctx: int = 2048
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


def _types_for(tokens: list[str]) -> list[int]:
    types = []
    for i, text in enumerate(tokens):
        if text.startswith("<0x") and len(text) == 6:
            types.append(gguf.TokenType.BYTE)
        elif text in ("<s>", "</s>"):
            types.append(gguf.TokenType.CONTROL)
        elif text == "<unk>":
            types.append(gguf.TokenType.UNKNOWN)
        else:
            types.append(gguf.TokenType.NORMAL)
    return types


def _weights(spec: TinySpec) -> dict[str, np.ndarray]:
    n_vocab, d, ff = len(spec.tokens), spec.n_embd, spec.n_ff
    rng = np.random.default_rng(spec.seed)
    noise = np.random.default_rng(spec.perturb_seed) if spec.perturb_seed is not None else None

    def mat(rows: int, cols: int, scale: float = 0.08) -> np.ndarray:
        w = rng.normal(0.0, scale, size=(rows, cols)).astype(np.float32)
        if noise is not None:
            w += noise.normal(0.0, scale * spec.perturb_scale, size=(rows, cols)).astype(np.float32)
        return w

    ones = np.ones(d, dtype=np.float32)
    tensors = {
        "token_embd.weight": mat(n_vocab, d, 1.0),
        "output_norm.weight": ones,
        "output.weight": mat(n_vocab, d, 0.15 * spec.logit_scale),
    }
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        tensors |= {
            p + "attn_norm.weight": ones,
            p + "attn_q.weight": mat(d, d),
            p + "attn_k.weight": mat(d, d),
            p + "attn_v.weight": mat(d, d),
            p + "attn_output.weight": mat(d, d),
            p + "ffn_norm.weight": ones,
            p + "ffn_gate.weight": mat(ff, d),
            p + "ffn_up.weight": mat(ff, d),
            p + "ffn_down.weight": mat(d, ff),
        }
    return tensors


def write_tiny_model(path: Path, spec: TinySpec | None = None) -> Path:
    spec = spec or TinySpec()
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(f"tiny-{spec.seed}")
    writer.add_context_length(spec.n_ctx)
    writer.add_embedding_length(spec.n_embd)
    writer.add_block_count(spec.n_layers)
    writer.add_feed_forward_length(spec.n_ff)
    writer.add_head_count(spec.n_head)
    writer.add_head_count_kv(spec.n_head)
    writer.add_rope_dimension_count(spec.n_embd // spec.n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
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
    for key, value in spec.extra.items():
        _add_value(writer, key, value)
    for name, array in _weights(spec).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
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
