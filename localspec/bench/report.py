"""Bench results as rows, a recommendation per workload, and JSON, CSV and PNG output.

JSON schema (``localspec bench --json FILE``), version ``localspec-bench/1``::

    {
      "schema": "localspec-bench/1",
      "model": str,                 # profile name or target file name
      "target": str, "draft": str | null,   # GGUF paths
      "settings": {"runs": int, "max_tokens": int, "temperature": float, "greedy": bool,
                   "configs": [str, ...]},  # e.g. "none", "lookup k=auto", "draft k=4"
      "rows": [Row, ...],           # one per workload x method x draft length, the baseline included
      "recommendations": [{"workload": str, "method": str, "draft_len": int | "auto" | null,
                           "speedup": float | null, "text": str}, ...],
      "overall": {same keys as a recommendation, "workload": "*"}   # what --write-profile stores
    }

    Row = {
      "workload": str, "method": str,  # method: none, draft, lookup, hybrid or auto
                                     # (a workload "NAME (cold)" / "NAME (warm)": a pass, see bench/runner.py)
      "history": bool,               # with an answer history (suffix decoding): --methods auto+history
      "draft_len": int | "auto" | null,  # "auto": chosen each round by the controller; null for "none"
      "prompts": int, "runs": int,
      "tok_per_s": float,            # decode tok/s: per prompt the median over runs, then the mean over prompts
      "baseline_tok_per_s": float,   # the same for method "none", measured interleaved in the same run
      "speedup": float | null,       # per prompt the median over runs of tok/s / the same round's baseline tok/s,
                                     # then the geometric mean over prompts; 1.0 for the baseline itself
      "expected_speedup": float | null,  # Leviathan's formula from this run's measured acceptance and costs
      "identical": bool | null,      # greedy: every output equals the baseline's token for token; null if sampled
      "first_difference": null | {"prompt": str, "index": int, "baseline_token": int | null,
                                  "speculative_token": int | null, "baseline_text": str, "speculative_text": str},
      "acceptance_rate": float,      # accepted / drafted tokens, pooled over prompts and runs
      "mean_accepted_length": float, # tokens emitted per target pass, pooled
      "per_position_acceptance": [float, ...],  # P(draft position i accepted | reached), pooled
      "target_passes": float,        # target forward passes per answer after prefill (mean of per-prompt medians)
      "generated_tokens": float,     # tokens per answer (mean of per-prompt medians)
      "ttft_s": float | null,        # time to first token, prefill of the uncached prompt included
      "planned": {choice: {"rounds": int, "expected_tokens": float, "tokens": int, "expected_s": float,
                           "seconds": float, "tokens_ratio": float | null, "time_ratio": float | null}},
                                     # the planner's priced rounds per choice ("none" too): what it expected
                                     # of them against what they gave, pooled
      "per_prompt": [{"id": str, "tok_per_s": float, "speedup": float | null, "expected_speedup": float | null,
                      "identical": bool | null, "ttft_s": float | null, "target_passes": float,
                      "acceptance_rate": float}, ...]
    }

CSV (``--csv FILE``) has one line per row with the scalar Row fields; ``per_position_acceptance`` is
joined with ``;`` and ``first_difference`` reduced to its index.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, median

from localspec.bench.runner import BASELINE, BenchResult, Config, PromptRecord
from localspec.engine.decoding.stats import GenerationStats
from localspec.errors import UsageError

SCHEMA = "localspec-bench/1"
# A gain below this is within what this kind of shared machine drifts between runs: not worth speculating for.
MIN_GAIN = 1.05
CSV_FIELDS = (
    "workload",
    "method",
    "history",
    "draft_len",
    "prompts",
    "runs",
    "tok_per_s",
    "baseline_tok_per_s",
    "speedup",
    "expected_speedup",
    "identical",
    "first_difference_index",
    "acceptance_rate",
    "mean_accepted_length",
    "per_position_acceptance",
    "target_passes",
    "generated_tokens",
    "ttft_s",
)


@dataclass(frozen=True)
class Recommendation:
    workload: str  # "*" for the one choice across all workloads
    method: str  # "none" means: do not speculate here
    draft_len: int | None
    speedup: float | None

    @property
    def text(self) -> str:
        if self.method == "none":
            best = f" (best speculative {self.speedup:.2f}x)" if self.speedup is not None else ""
            return f"do not speculate here{best}"
        return (
            f"--method {self.method}"
            + (f" --draft-len {self.draft_len}" if self.draft_len else "")
            + f" ({self.speedup:.2f}x)"
        )

    def to_dict(self) -> dict:
        return {
            "workload": self.workload,
            "method": self.method,
            "draft_len": _draft_len(Config(self.method, self.draft_len)),
            "speedup": _round(self.speedup, 3),
            "text": self.text,
        }


def build_rows(result: BenchResult) -> list[dict]:
    """One row per workload x configuration, in the order the workloads and configurations were given."""
    workloads = list(dict.fromkeys(p.workload for p in result.prompts))
    rows = []
    for workload in workloads:
        baseline = [r for r in result.records if r.prompt.workload == workload and r.config == BASELINE]
        for config in result.settings.all_configs:
            records = [r for r in result.records if r.prompt.workload == workload and r.config == config]
            rows.append(_row(workload, config, records, baseline, result.greedy))
    return rows


def recommend(rows: Sequence[dict]) -> list[Recommendation]:
    """Per workload, the fastest lossless configuration, or "none" when none gains at least MIN_GAIN."""
    workloads = list(dict.fromkeys(row["workload"] for row in rows))
    return [_best(workload, [r for r in rows if r["workload"] == workload]) for workload in workloads]


def recommend_overall(rows: Sequence[dict]) -> Recommendation:
    """One configuration for every workload: the best geometric-mean speedup among those lossless everywhere."""
    by_config: dict[tuple[str, object, bool], list[dict]] = {}
    for row in rows:
        by_config.setdefault((row["method"], row["draft_len"], row["history"]), []).append(row)
    candidates = [
        {"method": method, "draft_len": draft_len, "speedup": _geomean(r["speedup"] for r in group), "identical": None}
        for (method, draft_len, _), group in by_config.items()
        if method != "none" and all(r["identical"] is not False and r["speedup"] is not None for r in group)
    ]
    return _best("*", candidates)


def write_json(
    path: Path, rows: list[dict], recommendations: list[Recommendation], overall: Recommendation, meta: dict
) -> None:
    document = {
        "schema": SCHEMA,
        **meta,
        "rows": rows,
        "recommendations": [r.to_dict() for r in recommendations],
        "overall": overall.to_dict(),
    }
    _write(path, json.dumps(document, indent=2) + "\n")


def write_csv(path: Path, rows: Iterable[dict]) -> None:
    lines = []
    for row in rows:
        flat = {key: row.get(key) for key in CSV_FIELDS}
        flat["per_position_acceptance"] = ";".join(str(x) for x in row["per_position_acceptance"])
        flat["first_difference_index"] = row["first_difference"]["index"] if row["first_difference"] else ""
        lines.append({key: "" if value is None else value for key, value in flat.items()})
    try:
        with path.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            writer.writeheader()
            writer.writerows(lines)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from exc


def write_plot(path: Path, rows: Sequence[dict]) -> bool:
    """Speedup by configuration per workload as grouped bars; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: never open a window, work without a display
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    workloads = list(dict.fromkeys(row["workload"] for row in rows))
    labels = list(dict.fromkeys(row_label(row) for row in rows if row["method"] != "none"))
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(workloads) * max(1, len(labels)) ** 0.5 + 2), 4.5))
    for i, label in enumerate(labels):
        values = [_speedup_of(rows, workload, label) for workload in workloads]
        xs = [w + (i - (len(labels) - 1) / 2) * width for w in range(len(workloads))]
        ax.bar(xs, [v or 0.0 for v in values], width, label=label)
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")  # the baseline: target alone
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("speedup over target alone (decode tok/s)")
    ax.set_title("localspec bench")
    ax.legend(fontsize="small", ncol=2)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from exc
    finally:
        plt.close(fig)
    return True


# -- rows --------------------------------------------------------------------------------------------
def _row(
    workload: str, config: Config, records: list[PromptRecord], baseline: list[PromptRecord], greedy: bool
) -> dict:
    runs = [m for r in records for m in r.runs]
    per_prompt = [_prompt_figures(r, greedy) for r in records]
    pooled = GenerationStats.pooled(m.stats for m in runs).to_dict()
    differing = next((r for r in records if r.difference is not None), None)
    return {
        "workload": workload,
        "method": config.method,
        "history": config.history,
        "draft_len": _draft_len(config),
        "prompts": len(records),
        "runs": max((len(r.runs) for r in records), default=0),
        "tok_per_s": _round(fmean(p["tok_per_s"] for p in per_prompt), 2),
        "baseline_tok_per_s": _round(fmean(median(m.stats.decode_tok_per_s for m in r.runs) for r in baseline), 2),
        "speedup": _round(_geomean(p["speedup"] for p in per_prompt), 3),
        "expected_speedup": _round(_geomean(p["expected_speedup"] for p in per_prompt), 3),
        "identical": (differing is None) if greedy else None,
        "first_difference": _difference(differing),
        "acceptance_rate": pooled["acceptance_rate"],
        "mean_accepted_length": pooled["mean_accepted_length"],
        "per_position_acceptance": pooled["per_position_acceptance"],
        "target_passes": _round(fmean(p["target_passes"] for p in per_prompt), 1),
        "generated_tokens": _round(fmean(median(m.stats.generated_tokens for m in r.runs) for r in records), 1),
        "ttft_s": _round(_mean_or_none(p["ttft_s"] for p in per_prompt), 4),
        "planned": pooled["planned"],
        "per_prompt": per_prompt,
    }


def _prompt_figures(record: PromptRecord, greedy: bool) -> dict:
    runs = record.runs
    stats = [m.stats for m in runs]
    return {
        "id": record.prompt.id,
        "tok_per_s": _round(median(s.decode_tok_per_s for s in stats), 2),
        "speedup": _round(_median_or_none(m.speedup for m in runs), 3),
        "expected_speedup": _round(_median_or_none(m.expected_speedup for m in runs), 3),
        "identical": (record.difference is None) if greedy else None,
        "ttft_s": _round(_median_or_none(s.first_token_s for s in stats), 4),
        "target_passes": median(s.target_passes for s in stats),
        "acceptance_rate": GenerationStats.pooled(stats).to_dict()["acceptance_rate"],
    }


def _difference(record: PromptRecord | None) -> dict | None:
    if record is None:
        return None
    d = record.difference
    return {
        "prompt": record.prompt.id,
        "index": d.index,
        "baseline_token": d.baseline,
        "speculative_token": d.speculative,
        "baseline_text": d.baseline_text,
        "speculative_text": d.speculative_text,
    }


# -- recommendation ----------------------------------------------------------------------------------
def _best(workload: str, rows: Sequence[dict]) -> Recommendation:
    lossless = [r for r in rows if r["method"] != "none" and r["identical"] is not False and r["speedup"] is not None]
    if not lossless:
        return Recommendation(workload, "none", None, None)
    best = max(lossless, key=lambda r: r["speedup"])
    if best["speedup"] < MIN_GAIN:
        return Recommendation(workload, "none", None, best["speedup"])
    draft_len = best["draft_len"] if isinstance(best["draft_len"], int) else None
    return Recommendation(workload, best["method"], draft_len, best["speedup"])


# -- small helpers -----------------------------------------------------------------------------------
def row_label(row: dict) -> str:
    return Config(row["method"], row["draft_len"] if isinstance(row["draft_len"], int) else None, row["history"]).label


def _speedup_of(rows: Sequence[dict], workload: str, label: str) -> float | None:
    return next((r["speedup"] for r in rows if r["workload"] == workload and row_label(r) == label), None)


def _draft_len(config: Config) -> int | str | None:
    if config.method == "none":
        return None
    return config.draft_len if config.draft_len is not None else "auto"


def _geomean(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None and v > 0]
    return math.exp(fmean(math.log(v) for v in values)) if values else None


def _median_or_none(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return median(values) if values else None


def _mean_or_none(values: Iterable[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return fmean(values) if values else None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc}") from exc
