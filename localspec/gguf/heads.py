"""The drafters a model ships with or beside it, read from GGUF headers alone (for ``check``, ``doctor``
and ``profiles``): MTP ("nextn") layers inside a model, EAGLE-3 and DFlash heads as companion files.

The architecture lists copy the pinned llama.cpp (src/models/*.cpp with an LLM_GRAPH_TYPE_DECODER_MTP
graph; src/models/eagle3.cpp, dflash.cpp).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from localspec.gguf.memory import architecture

# Architectures whose pinned llama.cpp graph runs an MTP head (LLAMA_CONTEXT_TYPE_MTP).
MTP_ARCHITECTURES = frozenset({
    "qwen35", "qwen35moe", "qwen3next", "deepseek2", "deepseek32", "deepseek4", "glm4moe", "glm-dsa",
    "glm5-next", "bailingmoe3", "cohere2moe", "hy_v3", "mimo2", "nemotron_h_moe", "step35",
})
# Companion heads: a draft GGUF of this architecture reads the target's hidden states. Its architecture is
# also the method that drafts with it.
COMPANION_ARCHITECTURES = {"eagle3": "an EAGLE-3", "dflash": "a DFlash"}
# Targets whose pinned llama.cpp graph exposes its layer inputs (res->t_layer_inp in src/models/*.cpp), which
# EAGLE-3 and DFlash heads read; on any other, llama.cpp aborts at the first pass (llama-graph.cpp's assert).
LAYER_INPUT_ARCHITECTURES = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp", "gemma4", "gpt-oss",
    "nemotron_h", "lfm2", "minimax-01", "minimax-m2", "mimo2", "bailingmoe3", "deepseek4", "hunyuan_vl",
    "nanbeige", "muse-glimmer",
})
# The layers an EAGLE-3 head reads (llama.cpp's loop takes exactly three).
EAGLE3_LAYERS = 3
# A DFlash head's block when its file names none (llama.cpp's default in common/speculative.cpp).
DFLASH_DEFAULT_BLOCK = 16
# DFlash descendants localspec does not draft with, by a key only each one's converter writes.
DFLASH_VARIANTS = {
    "dflash.selector_top_k": "a DFlash2 head (its tokens come from a selector lattice)",
    "dflash.sample_from_anchor": "a DSpark head (a Markov head chains its block)",
    "dflash.hyper_connection.count": "a DeepSeek-V4 DSpark head",
}
DFLASH_VARIANT_FIX = (
    "localspec drafts with DFlash (block) heads only; stock llama.cpp's --spec-type draft-dflash or draft-dspark "
    "runs this one"
)


@dataclass(frozen=True)
class Heads:
    """What a model file carries for drafting."""

    architecture: str
    mtp_layers: int  # nextn_predict_layers: MTP blocks after the trunk
    companion: str | None  # "an EAGLE-3" or "a DFlash" when the file is such a head
    variant: str | None = None  # what DFlash descendant it is, when localspec does not draft with it

    @property
    def mtp_runs(self) -> bool:
        """Whether this build can run the MTP layers (the architecture has an MTP graph)."""
        return self.mtp_layers > 0 and self.architecture in MTP_ARCHITECTURES

    def describe(self) -> str:
        """One line for people: the heads and whether localspec drafts with them."""
        if self.variant:
            return f"{self.variant} for another model: {DFLASH_VARIANT_FIX}"
        if self.companion:
            return (f"{self.companion} head for another model: give it as the draft, --method {self.architecture} "
                    "(and auto) draft with it")
        if not self.mtp_layers:
            return "no built-in drafting heads"
        heads = f"{self.mtp_layers} MTP head{'s' if self.mtp_layers > 1 else ''} (nextn_predict_layers)"
        if not self.mtp_runs:
            return f"{heads}; the pinned llama.cpp has no MTP graph for {self.architecture}"
        if self.mtp_layers > 1:
            return f"{heads}; localspec drafts with single-head models only"
        return f"{heads}: --method mtp (and auto) draft with it, nothing to download"


def model_heads(header: Mapping[str, object]) -> Heads:
    arch = architecture(header)
    layers = header.get(f"{arch}.nextn_predict_layers", 0)
    return Heads(arch, layers if isinstance(layers, int) and layers > 0 else 0, COMPANION_ARCHITECTURES.get(arch),
                 dflash_variant(header) if arch == "dflash" else None)


def dflash_variant(header: Mapping[str, object]) -> str | None:
    """Which DFlash descendant a dflash head is (None: plain DFlash, which localspec drafts with)."""
    return next((what for key, what in DFLASH_VARIANTS.items() if key in header), None)


@dataclass(frozen=True)
class HeadFile:
    """A companion head file (EAGLE-3 or DFlash), as the engine loads it beside its target."""

    kind: str  # its architecture, "eagle3" or "dflash": also the method that drafts with it
    path: Path
    layers: tuple[int, ...]  # the target layers whose inputs it reads
    # DFlash: the trained block (the last token and up to block_size - 1 drafts), the mask token the
    # drafts are denoised from, and whether attention within the block is causal.
    block_size: int = 0
    mask_token: int = -1
    causal: bool = False


def companion_head(path: Path, header: Mapping[str, object]) -> HeadFile | None:
    """The companion head in ``path`` (its header already read), or None if the file is no such head."""
    arch = architecture(header)
    if arch not in COMPANION_ARCHITECTURES:
        return None
    layers = header.get(f"{arch}.target_layers")
    layers = tuple(layers) if isinstance(layers, list) else ()
    if arch == "eagle3":
        return HeadFile(arch, path, layers)
    block = header.get("dflash.block_size", DFLASH_DEFAULT_BLOCK)
    mask = header.get("tokenizer.ggml.mask_token_id", -1)
    return HeadFile(arch, path, layers, block_size=block if isinstance(block, int) else 0,
                    mask_token=mask if isinstance(mask, int) else -1,
                    causal=header.get("dflash.attention.causal") is True)


def companion_pairing(target: Mapping[str, object], head: Mapping[str, object]) -> list[str]:
    """What keeps a companion head from reading ``target``: the target's graph, its hidden size and the
    layers the head reads; for DFlash also its block, its mask token and its variant."""
    arch = architecture(head)
    problems = []
    target_arch = architecture(target)
    if target_arch not in LAYER_INPUT_ARCHITECTURES:
        problems.append(
            f"the pinned llama.cpp's {target_arch} graph does not expose its layer inputs, which the head reads "
            f"(it does for {', '.join(sorted(LAYER_INPUT_ARCHITECTURES))})"
        )
    # An EAGLE-3 head names the width it reads; a DFlash head reads rows of its own width.
    hidden = head.get(f"{arch}.target_hidden_size" if arch == "eagle3" else f"{arch}.embedding_length")
    target_hidden = target.get(f"{architecture(target)}.embedding_length")
    if isinstance(hidden, int) and isinstance(target_hidden, int) and hidden != target_hidden:
        problems.append(f"it reads hidden states of width {hidden}, the target's are {target_hidden}")
    layers = head.get(f"{arch}.target_layers")
    if arch == "eagle3" and (not isinstance(layers, list) or len(layers) != EAGLE3_LAYERS):
        problems.append(f"its {arch}.target_layers must name {EAGLE3_LAYERS} target layers, it has {layers!r}")
    if arch == "dflash":
        problems += _dflash_problems(head, layers)
    blocks = target.get(f"{architecture(target)}.block_count")
    if isinstance(layers, list) and isinstance(blocks, int):
        blocks -= model_heads(target).mtp_layers  # MTP blocks come after the trunk
        beyond = [layer for layer in layers if isinstance(layer, int) and not 0 <= layer < blocks]
        if beyond:
            problems.append(f"it reads target layers {beyond}, the target has {blocks}")
    return problems


def _dflash_problems(head: Mapping[str, object], layers: object) -> list[str]:
    problems = []
    if not isinstance(layers, list) or not layers:
        problems.append(f"its dflash.target_layers must name the target layers it reads, it has {layers!r}")
    block = head.get("dflash.block_size", DFLASH_DEFAULT_BLOCK)
    if not isinstance(block, int) or block < 2:
        problems.append(f"its dflash.block_size must be at least 2, it is {block!r}")
    if not isinstance(head.get("tokenizer.ggml.mask_token_id"), int):
        problems.append("it names no mask token (tokenizer.ggml.mask_token_id), which its drafts start from")
    variant = dflash_variant(head)
    if variant:
        problems.append(f"it is {variant}: {DFLASH_VARIANT_FIX}")
    return problems
