"""The target GGUF as training needs it: its shape, the weights the head borrows or starts from
(dequantized), and the trained head written beside it in llama.cpp's eagle3 layout with its tokenizer."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from localspec.errors import UsageError
from localspec.gguf.header import read_header
from localspec.gguf.heads import LAYER_INPUT_ARCHITECTURES
from scripts.train_head.head import HeadShape
from scripts.train_head.layout import add_eagle3_keys, add_head_header


@dataclass(frozen=True)
class TargetInfo:
    path: Path
    architecture: str
    n_layers: int
    n_embd: int
    n_head: int
    n_ff: int
    n_ctx: int


def target_info(path: Path) -> TargetInfo:
    """The target's shape from its header; a file that is not a target an EAGLE-3 head can read is a
    UsageError naming the fix."""
    if not path.is_file():
        raise UsageError(f"{path} is not a file: give the target model's GGUF with --target")
    header = read_header(path)
    arch = str(header.get("general.architecture"))
    if arch not in LAYER_INPUT_ARCHITECTURES or f"{arch}.block_count" not in header:
        raise UsageError(f"{path.name} is a {arch!r} model, whose llama.cpp graph gives an EAGLE-3 head no layer "
                         f"inputs; give a target of one of: {', '.join(sorted(LAYER_INPUT_ARCHITECTURES))}")
    ff = header.get(f"{arch}.feed_forward_length")
    return TargetInfo(path, arch, int(header[f"{arch}.block_count"]), int(header[f"{arch}.embedding_length"]),
                      int(header[f"{arch}.attention.head_count"]), int(ff if isinstance(ff, int) else 0),
                      int(header.get(f"{arch}.context_length", 4096)))


def borrowed_weights(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(token embeddings, output norm, output projection) of the target in float32: the head reads the
    embeddings (llama.cpp lends it the target's), and starts its own norm and projection from the others.
    A model with tied embeddings projects with its embedding table."""
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}

    def dequantized(name: str) -> np.ndarray:
        tensor = tensors[name]
        return np.asarray(gguf.quants.dequantize(tensor.data, tensor.tensor_type), np.float32)

    embed = dequantized("token_embd.weight")
    output = dequantized("output.weight") if "output.weight" in tensors else embed
    return embed, dequantized("output_norm.weight"), output


def write_head(out: Path, target: TargetInfo, shape: HeadShape, layers: tuple[int, ...], params: dict,
               d2t: np.ndarray, *, f16: bool) -> Path:
    """The trained head as a GGUF of llama.cpp's eagle3 layout, with the target's tokenizer (as converted
    heads carry it); with ``f16`` its matrices in half precision (llama.cpp keeps norms in float32)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(out), "eagle3")
    writer.add_name(f"{target.path.stem} EAGLE-3 head (localspec scripts.train_head)")
    add_head_header(writer, arch="eagle3", n_ctx=target.n_ctx, n_embd=shape.n_embd, n_ff=shape.n_ff,
                    n_head=shape.n_head, head_dim=shape.head_dim, layers=layers, f16=f16)
    add_eagle3_keys(writer, target_hidden=target.n_embd)
    for name, field in gguf.GGUFReader(target.path).fields.items():
        if name.startswith("tokenizer."):
            kind = field.types[0]
            sub = field.types[1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    for name in shape.shapes():
        if name == "d2t":
            writer.add_tensor(name, d2t.astype(np.int64))
        else:
            value = np.asarray(params[name], np.float32)
            writer.add_tensor(name, value.astype(np.float16) if f16 and value.ndim == 2 else value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out
