"""Every drafter the decoder can use, registered in one place, and the ``--method`` names they make.

The method names, which drafters each one drafts with, what each needs and how its tokens are shown all
come from the drafter classes (see base.py); this module only lists the classes and derives the rest, so
the CLI, the live view, profiles and the planner read one table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from localspec.engine.drafters.base import FORCED, TARGET_ALONE, BaseDrafter
from localspec.engine.drafters.dflash import DFlashDrafter
from localspec.engine.drafters.draft_model import DraftModelDrafter
from localspec.engine.drafters.eagle3 import Eagle3Drafter
from localspec.engine.drafters.grammar import GrammarDrafter
from localspec.engine.drafters.lookup import LookupDrafter
from localspec.engine.drafters.mtp import MtpDrafter
from localspec.engine.drafters.suffix import SuffixDrafter
from localspec.engine.llama.model import Model
from localspec.engine.persist.history import HistoryStore
from localspec.errors import UsageError
from localspec.gguf.heads import HeadFile

# In the order the planner breaks ties in. A new drafter is its module plus its class here.
DRAFTERS: tuple[type[BaseDrafter], ...] = (
    GrammarDrafter, LookupDrafter, SuffixDrafter, DraftModelDrafter, MtpDrafter, Eagle3Drafter, DFlashDrafter,
)

AUTO = "auto"  # drafts with every drafter it can make, where the planner expects drafting to pay
DEFAULT_METHOD = AUTO


def _methods() -> tuple[str, ...]:
    """The target alone, each drafter's own methods, the methods several drafters share, and auto."""
    named = [method for cls in DRAFTERS for method in cls.methods]
    unique = list(dict.fromkeys(named))
    shared = [method for method in unique if named.count(method) > 1]
    return (TARGET_ALONE, *(m for m in unique if m not in shared), *shared, AUTO)


METHODS = _methods()
# The methods that draft with a head, which `bench` measures only where the pair has one.
HEAD_METHODS = tuple(method for cls in DRAFTERS if cls.drafts_with_head for method in cls.methods)
_BY_SOURCE = {cls.source: cls for cls in DRAFTERS}


def uses(method: str, source: str) -> bool:
    """Whether ``method`` drafts from ``source``: auto from every drafter, the target alone from none."""
    cls = _BY_SOURCE.get(source)
    if cls is None or method == TARGET_ALONE:
        return False
    return method == AUTO or cls.kind == FORCED or method in cls.methods


def method_missing(method: str, missing: Mapping[str, str]) -> str:
    """Why ``method`` cannot run, given why each drafter cannot (``missing``: reasons by source); "" when
    it can. Auto runs with whatever it has."""
    if method == AUTO:
        return ""
    for cls in DRAFTERS:
        if uses(method, cls.source) and missing.get(cls.source):
            return f"needs {cls.needs}: {missing[cls.source]}"
    return ""


def check_method(method: str, *, missing: Mapping[str, str] = {}, given_as: str = "method") -> str:
    """The one check of a method name, and (given ``missing``, see ``method_missing``) that it can run.

    ``given_as`` names where the user wrote it (``--method``, ``/method``), so the error points there.
    """
    if method not in METHODS:
        raise UsageError(f"unknown {given_as} {method!r}; use one of {', '.join(METHODS)}")
    why = method_missing(method, missing)
    if why:
        raise UsageError(f"{given_as} {method} {why}")
    return method


@dataclass(frozen=True)
class DrafterInputs:
    """What drafters are built from."""

    target: Model
    draft: DraftModelDrafter | None = None
    history: HistoryStore | None = None
    method: str = AUTO
    head: HeadFile | None = None  # a companion head (EAGLE-3, DFlash) given as the pair's draft


def make_drafters(inputs: DrafterInputs) -> list[BaseDrafter]:
    """The drafters ``inputs.method`` drafts with that can run here: another's per-round upkeep (an n-gram
    index, a head's context) would be paid for nothing."""
    made = (
        cls.make(inputs) for cls in DRAFTERS if uses(inputs.method, cls.source) and not cls.missing(inputs)
    )
    return [drafter for drafter in made if drafter is not None]


def missing_drafters(inputs: DrafterInputs, made: list[BaseDrafter]) -> dict[str, str]:
    """Why each drafter that needs something is not among ``made`` (reasons by source)."""
    have = {drafter.source for drafter in made}
    return {
        cls.source: cls.missing(inputs) or f"it was not loaded for method {inputs.method} (start with {cls.methods[0]} or auto)"
        for cls in DRAFTERS
        if cls.needs and cls.source not in have
    }
