"""The drafters a model ships with or beside it, read from GGUF headers alone (for ``check``, ``doctor``
and ``profiles``): MTP ("nextn") layers inside a model, EAGLE-3 and DFlash heads as companion files.

The architecture lists copy the pinned llama.cpp (src/models/*.cpp with an LLM_GRAPH_TYPE_DECODER_MTP
graph; src/models/eagle3.cpp, dflash.cpp).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from localspec.gguf.memory import architecture

# Architectures whose pinned llama.cpp graph runs an MTP head (LLAMA_CONTEXT_TYPE_MTP).
MTP_ARCHITECTURES = frozenset({
    "qwen35", "qwen35moe", "qwen3next", "deepseek2", "deepseek32", "deepseek4", "glm4moe", "glm-dsa",
    "glm5-next", "bailingmoe3", "cohere2moe", "hy_v3", "mimo2", "nemotron_h_moe", "step35",
})
# Companion heads: a draft GGUF of this architecture reads the target's hidden states.
COMPANION_ARCHITECTURES = {"eagle3": "an EAGLE-3", "dflash": "a DFlash"}
# Why localspec cannot run a companion head with the pinned build.
COMPANION_REFUSAL = (
    "localspec cannot run it yet: it reads the target's layer inputs, which the pinned llama-cpp-python "
    "does not bind (llama_set_embeddings_layer_inp); use the model's MTP head (--method mtp) or a draft model"
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
        if self.companion:
            return f"{self.companion} head for another model: {COMPANION_REFUSAL}"
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


def companion_pairing(target: Mapping[str, object], head: Mapping[str, object]) -> list[str]:
    """What keeps an EAGLE-3 head from reading ``target``: its hidden size and the layers it reads."""
    arch = architecture(head)
    problems = []
    hidden = head.get(f"{arch}.target_hidden_size")
    target_hidden = target.get(f"{architecture(target)}.embedding_length")
    if isinstance(hidden, int) and isinstance(target_hidden, int) and hidden != target_hidden:
        problems.append(f"it reads hidden states of width {hidden}, the target's are {target_hidden}")
    layers = head.get(f"{arch}.target_layers")
    blocks = target.get(f"{architecture(target)}.block_count")
    if isinstance(layers, list) and isinstance(blocks, int):
        blocks -= model_heads(target).mtp_layers  # MTP blocks come after the trunk
        beyond = [layer for layer in layers if isinstance(layer, int) and not 0 <= layer < blocks]
        if beyond:
            problems.append(f"it reads target layers {beyond}, the target has {blocks}")
    return problems
