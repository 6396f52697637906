"""Every drafter the decoder can use, registered in one place (the interface is drafting.py's)."""

from __future__ import annotations

from dataclasses import dataclass

from localspec.engine.drafters.base import BaseDrafter
from localspec.engine.drafters.dflash import DFlashDrafter
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.drafters.eagle3 import Eagle3Drafter
from localspec.engine.drafters.grammar import GrammarDrafter
from localspec.engine.drafters.lookup import LookupDrafter
from localspec.engine.drafters.mtp import MtpDrafter
from localspec.engine.drafters.suffix import SuffixDrafter
from localspec.engine.llama.model import Model
from localspec.engine.persist.history import HistoryStore
from localspec.gguf.heads import HeadFile


@dataclass(frozen=True)
class DrafterInputs:
    """What drafters are built from; ``make`` returns None for a drafter these cannot support."""

    target: Model
    draft: DraftModelDrafter | None = None
    history: HistoryStore | None = None
    method: str = "auto"  # drafters whose setup costs even when unused (the MTP head's) skip methods without them
    head: HeadFile | None = None  # a companion head (EAGLE-3, DFlash) given as the pair's draft


# In the order the planner breaks ties in. A new drafter adds its class (with a ``make(inputs)``) here.
DRAFTERS: tuple[type[BaseDrafter], ...] = (
    GrammarDrafter, LookupDrafter, SuffixDrafter, DraftModelDrafter, MtpDrafter, Eagle3Drafter, DFlashDrafter,
)


def make_drafters(inputs: DrafterInputs) -> list[BaseDrafter]:
    return [drafter for cls in DRAFTERS if (drafter := cls.make(inputs)) is not None]
