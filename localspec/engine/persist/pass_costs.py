"""Target pass costs remembered across sessions, so ``auto`` starts from this machine's cost curve.

On a CPU the cost of a verification pass is far from linear in its size (here a 32-token pass cost
less than twice a 16-token one: llama.cpp switches kernels), and a session learns a size only by
paying for it. Remembering the measured curve lets the next session's first long copy take the draft
length that pays instead of the one a guess allows. Costs are kept relative to a one-token pass, which
every session measures afresh, and keyed by what sets them (model file, threads, kernels, build, CPU).
They are seeded as measurements, so a stale one is outvoted after a few passes of that size.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path

from localspec.paths import temp_beside

# Machines and models remembered, most recent last; older ones are dropped.
MAX_ENTRIES = 32
# Entries of earlier versions are not read: before version 2, a large prompt pass was remembered as if it
# were a verification of its size, which it undercuts by a third on a CPU.
VERSION = 2


class PassCostMemory:
    """One JSON file of ``{identity: {batch size: cost relative to a one-token pass}}``.

    A file that cannot be read or parsed counts as empty (it only holds measurements, which come
    back), and it is rewritten whole through a temporary file, so a crash never leaves half of one.
    """

    def __init__(self, path: Path, identity: str) -> None:
        self.path = path
        self.identity = f"{identity} | pass costs v{VERSION}"

    def _read(self) -> dict[str, dict[str, float]]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def load(self) -> dict[int, float]:
        entry = self._read().get(self.identity)
        if not isinstance(entry, dict):
            return {}
        costs = {}
        for batch, relative in entry.items():
            if batch.isdigit() and isinstance(relative, (int, float)) and 0 < relative < math.inf:
                costs[int(batch)] = float(relative)
        return costs

    def save(self, costs: Mapping[int, float]) -> None:
        """Merge ``costs`` into this identity's entry; a failed write is skipped (memory is optional)."""
        if not costs:
            return
        data = self._read()
        entry = data.pop(self.identity, None)
        entry = entry if isinstance(entry, dict) else {}
        entry.update({str(batch): round(relative, 4) for batch, relative in costs.items()})
        data[self.identity] = entry
        for stale in list(data)[: max(0, len(data) - MAX_ENTRIES)]:
            del data[stale]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with temp_beside(self.path) as (tmp, out):
                out.write(json.dumps(data, indent=1).encode())
                out.close()
                os.replace(tmp, self.path)
        except OSError:
            pass
