"""``localspec bench --vs-llama-cpp DIR``: localspec side by side with stock llama.cpp tools, one table.

Measuring lives in ``localspec.bench.stock``; this module checks options, shows progress on stderr,
prints the table on stdout and writes the JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from pathlib import Path

from rich import box
from rich.table import Table

from localspec.bench import stock
from localspec.bench.runner import Config, ProgressCallback
from localspec.bench.workloads import BenchPrompt, for_target
from localspec.cli import options as o
from localspec.cli.console import add_columns, err, out
from localspec.engine.drafters.registry import HEAD_METHODS, check_method, method_missing
from localspec.engine.llama.rpc import parse_layout
from localspec.errors import UsageError
from localspec.session import close_decoder, remember_pass_costs


def compare_with_llama_cpp(
    bin_dir: Path,
    generation: o.GenerationOptions,
    stock_rpc: str | None,
    prompts: Sequence[BenchPrompt],
    configs: Sequence[Config],
    *,
    runs: int,
    max_tokens: int,
    json_path: Path | None,
    unsupported: dict[str, object],
    progress: Callable[[], AbstractContextManager[ProgressCallback]],
    named: bool,
) -> None:
    """Check the tools and options first (before any model loads), then measure, print and write."""
    given = [name for name, value in unsupported.items() if value]
    if given:
        raise UsageError(f"--vs-llama-cpp has its own table and --json; drop {', '.join(given)}")
    if generation.temp:
        raise UsageError("--vs-llama-cpp compares greedy outputs; drop --temp or use --temp 0")
    tools = stock.find_tools(bin_dir)
    if generation.rpc is not None and stock_rpc is None:
        raise UsageError("--rpc with --vs-llama-cpp also needs --stock-rpc HOST:PORT,...: other rpc-servers on the "
                         "same machines for the stock tools (each serves one client at a time)")
    stock_servers = parse_layout(stock_rpc).servers if stock_rpc is not None else ()
    if generation.rpc is not None and len(stock_servers) != len(parse_layout(generation.rpc).servers):
        raise UsageError("--stock-rpc needs as many servers as --rpc, in the same order (the same layout)")
    pair, decoder, _ = replace(generation, temp=0.0).open()
    prompts, note = for_target(list(prompts), decoder.target, named=named)  # completions need FIM tokens
    if note:
        err.print(note)
    # Beside stock draft-mtp, draft-eagle3 and draft-dflash, where the target has its own head or the draft is one.
    missing = decoder.controller.missing
    for method in HEAD_METHODS:
        if not method_missing(method, missing) and not any(c.method == method for c in configs):
            configs = [*configs, Config(method)]
    for config in configs:
        check_method(config.method, missing=missing)
    settings = stock.StockSettings(configs, runs=runs, max_tokens=max_tokens, rpc_servers=stock_servers)
    try:
        with progress() as update:
            comparison = stock.StockComparison(
                decoder, tools, target=pair.target, draft=pair.draft, settings=settings, progress=update
            )
            result = comparison.run(prompts)
        remember_pass_costs(comparison.runner.decoders.values())  # as a session does, for the sessions after it
        comparison.runner.close()
    finally:
        close_decoder(decoder)  # while --rpc-latency-ms's relays still run
    rows = stock.build_rows(result)
    target = decoder.target
    title = (
        f"{pair.label} vs stock llama.cpp ({bin_dir}): {runs} run(s), {max_tokens} tokens, greedy, "
        f"threads {target.n_threads}, ctx {target.n_ctx}, localspec kernels {target.kernels}"
    )
    out.print(_table(title, rows))
    baseline = next((r for r in stock.overall_rows(rows) if r["engine"] == stock.STOCK_BASELINE.label), None)
    if baseline is not None and baseline["choosing_share"]:
        # Said outright, so that no ratio above passes for a faster pass: stock's sampler is part of its wait.
        share = baseline["choosing_share"]
        out.prose(
            f"stock llama-completion's decode includes choosing each token (its sampler chain): {share:.1%} of it; "
            f"against its passes alone, every decode ratio above is {1 - share:.3f} times as large"
        )
    for row in stock.overall_rows(rows):
        if row["per_position_acceptance"]:  # localspec's engines; stock's tools print totals only
            positions = " ".join(f"{x:.2f}" for x in row["per_position_acceptance"][:POSITIONS_SHOWN])
            out.prose(f"{row['engine']} accepted by draft position (1, 2, ...), {row['workload']}: {positions}")
    spread = _spread(rows)
    if spread:
        out.prose(spread)
    for row in rows:
        if not stock.reference(row["engine"]) and not row["identical"]:
            out.prose(f"  {row['workload']}, {row['engine']} {_difference(row)}")
    if json_path:
        meta = {
            "model": pair.label,
            "target": str(pair.target),
            "draft": None if pair.draft is None else str(pair.draft),
            "llama_cpp_bin": str(bin_dir),
            "settings": {
                "runs": runs,
                "max_tokens": max_tokens,
                "threads": target.n_threads,
                "n_ctx": target.n_ctx,
                "localspec_kernels": target.kernels,
                "engines": [e.label for e in result.engines],
            },
        }
        stock.write_json(json_path, rows, meta)
        err.print(f"wrote {json_path}")


def _spread(rows: list[dict]) -> str | None:
    """How far apart runs put one prompt's decode ratio, at the widest (the machine's noise in one run's
    figure, which the table's medians over runs damp); None with one run."""
    spreads = [
        (row["decode_ratio_range"][1] / row["decode_ratio_range"][0], row)
        for row in rows
        if row["runs"] > 1 and row["decode_ratio_range"] and not stock.reference(row["engine"])
        and row["workload"] != "all"
    ]
    if not spreads:
        return None
    widest, row = max(spreads, key=lambda spread: spread[0])
    low, high = row["decode_ratio_range"]
    return (
        f"between runs, one prompt's decode ratio moved by up to {widest - 1:.0%} ({row['engine']}, "
        f"{row['workload']}: {low:.2f}x-{high:.2f}x); the table gives each prompt's median over runs, --json "
        "every row's range (decode_ratio_range)"
    )


PAST_BUDGET = "†"
POSITIONS_SHOWN = 6


def _table(title: str, rows: list[dict]) -> Table:
    """Narrow enough for a terminal or a 100-column log: figures never wrap; where an output differs from stock
    target alone's, the lines after the table say where (``_difference``)."""
    table = Table(title=title, box=box.SIMPLE_HEAD, collapse_padding=True, show_edge=False, pad_edge=False, title_justify="left")
    if any(row["past_budget"] for row in rows):
        table.caption = (
            f"{PAST_BUDGET} decoded past the token budget (a draft the stock tool did not cut at -n): its rate "
            "and acceptance count those tokens, the likeliest of a copy"
        )
    add_columns(
        table,
        ("workload", "engine", "decode tok/s", "prefill tok/s", "decode", "prefill", "accepted", "output"),
        wrapping=("workload", "engine", "accepted"),
        left=("workload", "engine", "output"),
    )
    previous = None
    for row in rows:
        if previous is not None and row["workload"] != previous:
            table.add_section()
        previous = row["workload"]
        table.add_row(
            row["workload"],
            row["engine"],
            _number(row["decode_tok_per_s"]),
            _number(row["prefill_tok_per_s"]),
            _x(row["decode_ratio"]) + _past_budget(row),
            _x(row["prefill_ratio"]),
            _accepted(row) + _past_budget(row),
            _output(row),
        )
    return table


def _accepted(row: dict) -> str:
    if row["drafted"] is None:
        return "-"
    if not row["drafted"]:
        return "none drafted"
    return f"{row['accepted']}/{row['drafted']} ({row['acceptance_rate']:.0%})"


def _past_budget(row: dict) -> str:
    return f" {PAST_BUDGET}{row['past_budget']:g}" if row["past_budget"] else ""


def _output(row: dict) -> str:
    if stock.reference(row["engine"]):
        return "(reference)"
    return "identical" if row["identical"] else "differs"


def _difference(row: dict) -> str:
    d = row["differences"][0]
    more = f" (+{len(row['differences']) - 1} prompts)" if len(row["differences"]) > 1 else ""
    return f"differs in {d['prompt']} at char {d['index']}: {d['baseline']!r} vs {d['other']!r}{more}"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
