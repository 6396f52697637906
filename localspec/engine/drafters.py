"""Every drafter the decoder can use, registered in one place (the interface is drafting.py's)."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.backend import LlamaModel
from localspec.engine.draft_model import DraftModelProposer
from localspec.engine.drafting import BaseDrafter
from localspec.engine.dflash import DFlashDrafter
from localspec.engine.eagle3 import Eagle3Drafter
from localspec.engine.grammar_drafter import GrammarDrafter
from localspec.engine.history import HistoryStore, SuffixDrafter
from localspec.engine.lookup import LookupDrafter
from localspec.engine.mtp import MtpDrafter
from localspec.gguf.heads import HeadFile


@dataclass(frozen=True)
class DrafterInputs:
    """What drafters are built from; ``make`` returns None for a drafter these cannot support."""

    target: LlamaModel
    draft: DraftModelProposer | None = None
    history: HistoryStore | None = None
    method: str = "auto"  # drafters whose setup costs even when unused (the MTP head's) skip methods without them
    head: HeadFile | None = None  # a companion head (EAGLE-3, DFlash) given as the pair's draft


# In the order the planner breaks ties in. A new drafter adds its class (with a ``make(inputs)``) here.
DRAFTERS: tuple[type[BaseDrafter], ...] = (
    GrammarDrafter, LookupDrafter, SuffixDrafter, DraftModelProposer, MtpDrafter, Eagle3Drafter, DFlashDrafter,
)


def make_drafters(inputs: DrafterInputs) -> list[BaseDrafter]:
    return [drafter for cls in DRAFTERS if (drafter := cls.make(inputs)) is not None]
