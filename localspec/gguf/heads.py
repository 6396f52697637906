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
# Companion heads: a draft GGUF of this architecture reads the target's hidden states.
COMPANION_ARCHITECTURES = {"eagle3": "an EAGLE-3", "dflash": "a DFlash"}
# Targets whose pinned llama.cpp graph exposes its layer inputs (res->t_layer_inp in src/models/*.cpp), which
# an EAGLE-3 head reads; on any other, llama.cpp aborts at the first pass (llama-graph.cpp's assert).
LAYER_INPUT_ARCHITECTURES = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "qwen4exp", "gemma4", "gpt-oss",
    "nemotron_h", "lfm2", "minimax-01", "minimax-m2", "mimo2", "bailingmoe3", "deepseek4", "hunyuan_vl",
    "nanbeige", "muse-glimmer",
})
# The layers an EAGLE-3 head reads (llama.cpp's loop takes exactly three).
EAGLE3_LAYERS = 3
# Why localspec cannot run a DFlash head.
DFLASH_REFUSAL = (
    "localspec does not draft with DFlash heads yet (stock llama.cpp's --spec-type draft-dflash does); "
    "use the model's MTP head (--method mtp), an EAGLE-3 head or a draft model"
)


@dataclass(frozen=True)
class Heads:
    """What a model file carries for drafting."""

    architecture: str
    mtp_layers: int  # nextn_predict_layers: MTP blocks after the trunk
    companion: str | None  # "an EAGLE-3" or "a DFlash" when the file is such a head

    @property
    def mtp_runs(self) -> bool:
        """Whether this build can run the MTP layers (the architecture has an MTP graph)."""
        return self.mtp_layers > 0 and self.architecture in MTP_ARCHITECTURES

    def describe(self) -> str:
        """One line for people: the heads and whether localspec drafts with them."""
        if self.architecture == "eagle3":
            return "an EAGLE-3 head for another model: give it as the draft, --method eagle3 (and auto) draft with it"
        if self.companion:
            return f"{self.companion} head for another model: {DFLASH_REFUSAL}"
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
    return Heads(arch, layers if isinstance(layers, int) and layers > 0 else 0, COMPANION_ARCHITECTURES.get(arch))


@dataclass(frozen=True)
class Eagle3HeadFile:
    """An EAGLE-3 head file, as the engine loads it beside its target."""

    path: Path
    layers: tuple[int, ...]  # the target layers whose inputs it reads


def eagle3_head(path: Path, header: Mapping[str, object]) -> Eagle3HeadFile | None:
    """The EAGLE-3 head in ``path`` (its header already read), or None if the file is no such head."""
    if architecture(header) != "eagle3":
        return None
    layers = header.get("eagle3.target_layers")
    return Eagle3HeadFile(path, tuple(layers) if isinstance(layers, list) else ())


def companion_pairing(target: Mapping[str, object], head: Mapping[str, object]) -> list[str]:
    """What keeps an EAGLE-3 head from reading ``target``: the target's graph, its hidden size and the
    layers the head reads."""
    arch = architecture(head)
    problems = []
    target_arch = architecture(target)
    if target_arch not in LAYER_INPUT_ARCHITECTURES:
        problems.append(
            f"the pinned llama.cpp's {target_arch} graph does not expose its layer inputs, which the head reads "
            f"(it does for {', '.join(sorted(LAYER_INPUT_ARCHITECTURES))})"
        )
    hidden = head.get(f"{arch}.target_hidden_size")
    target_hidden = target.get(f"{architecture(target)}.embedding_length")
    if isinstance(hidden, int) and isinstance(target_hidden, int) and hidden != target_hidden:
        problems.append(f"it reads hidden states of width {hidden}, the target's are {target_hidden}")
    layers = head.get(f"{arch}.target_layers")
    if not isinstance(layers, list) or len(layers) != EAGLE3_LAYERS:
        problems.append(f"its {arch}.target_layers must name {EAGLE3_LAYERS} target layers, it has {layers!r}")
    blocks = target.get(f"{architecture(target)}.block_count")
    if isinstance(layers, list) and isinstance(blocks, int):
        blocks -= model_heads(target).mtp_layers  # MTP blocks come after the trunk
        beyond = [layer for layer in layers if isinstance(layer, int) and not 0 <= layer < blocks]
        if beyond:
            problems.append(f"it reads target layers {beyond}, the target has {blocks}")
    return problems
