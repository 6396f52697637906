"""``localspec bench``: target alone vs each speculative configuration per workload, and what to run.

Measuring lives in ``localspec.bench``; this module parses options, shows progress on stderr, prints a
table and a recommendation per workload on stdout, and writes the JSON, CSV, plot and profile asked for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from localspec import paths
from localspec.bench import report
from localspec.bench.relay import LatencyRelay
from localspec.bench.runner import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_RUNS,
    HISTORY_SUFFIX,
    BenchRunner,
    BenchSettings,
    Config,
    ProgressCallback,
)
from localspec.bench.tuned_profile import write_tuned_profile
from localspec.bench.workloads import for_target, load_prompt_file, select, shipped_prompts
from localspec.cli import options as o
from localspec.cli.bench_stock import compare_with_llama_cpp
from localspec.cli.console import add_columns, err, out
from localspec.engine.drafters.registry import HEAD_METHODS, METHODS, check_method, method_missing
from localspec.engine.llama.rpc import parse_layout
from localspec.errors import UsageError
from localspec.session import close_decoder, remember_pass_costs

# mtp joins the defaults where the target has an MTP head (see bench_command).
DEFAULT_METHODS = ",".join(m for m in METHODS if m not in HEAD_METHODS)
QUICK_METHODS = "none,lookup,auto"
QUICK_MAX_TOKENS = 96
QUICK_RUNS = 1


@o.generation_options(speculation=False)
def bench_command(
    workloads: Annotated[
        Optional[str], typer.Option("--workloads", help="Comma-separated slices [default: all].")
    ] = None,
    prompts: Annotated[
        Optional[Path],
        typer.Option("--prompts", help='Your own JSONL prompts: {"workload": ..., "prompt": ...} per line.'),
    ] = None,
    methods: Annotated[
        Optional[str],
        typer.Option(
            "--methods",
            help=f"Comma-separated methods [default: {DEFAULT_METHODS}, and mtp where the target has an MTP head]; "
            f"auto{HISTORY_SUFFIX} adds an answer "
            "history, learned in a cold pass over the prompts and used again in a warm one.",
        ),
    ] = None,
    draft_len: Annotated[
        str, typer.Option("--draft-len", help="Comma-separated draft lengths; 'auto' lets the controller choose.")
    ] = "auto",
    runs: Annotated[
        Optional[int], typer.Option("--runs", min=1, help=f"Timed runs per prompt [default: {DEFAULT_RUNS}].")
    ] = None,
    max_tokens: Annotated[
        Optional[int],
        typer.Option("--max-tokens", "-n", min=1, help=f"Tokens per answer [default: {DEFAULT_MAX_TOKENS}]."),
    ] = None,
    json_path: Annotated[
        Optional[Path], typer.Option("--json", help="Write the rows as JSON (schema: localspec-bench/1).")
    ] = None,
    csv_path: Annotated[Optional[Path], typer.Option("--csv", help="Write the rows as CSV.")] = None,
    plot_path: Annotated[
        Optional[Path], typer.Option("--plot", help="Write a PNG of speedup per workload (needs matplotlib).")
    ] = None,
    quick: Annotated[
        bool,
        typer.Option(
            "--quick", help=f"One prompt per slice, {QUICK_METHODS}, {QUICK_MAX_TOKENS} tokens, one run: a few minutes."
        ),
    ] = False,
    write_profile: Annotated[
        Optional[str], typer.Option("--write-profile", help="Save the overall recommendation as this user profile.")
    ] = None,
    vs_llama_cpp: Annotated[
        Optional[Path],
        typer.Option(
            "--vs-llama-cpp",
            metavar="DIR",
            help="Compare with stock llama.cpp tools in DIR (build them: scripts/build-llama-cpp-stock) "
            f"[default methods: {QUICK_METHODS}].",
        ),
    ] = None,
    stock_rpc: Annotated[
        Optional[str],
        typer.Option(
            "--stock-rpc",
            help="With --rpc and --vs-llama-cpp: other rpc-servers on the same machines, for the stock tools "
            "(a server serves one client at a time, and localspec's target holds --rpc's).",
        ),
    ] = None,
    rpc_latency_ms: Annotated[
        Optional[float],
        typer.Option(
            "--rpc-latency-ms",
            min=0.0,
            help="With --rpc on 127.0.0.1: add this round-trip time in front of every server (a relay per server, "
            "stock's too), to price a network on one machine.",
        ),
    ] = None,
    *,
    generation: o.GenerationOptions,
) -> None:
    """Measure target alone and speculative decoding per workload, check outputs match, recommend a method."""
    with contextlib.ExitStack() as relays:
        if rpc_latency_ms is not None:
            generation, stock_rpc = _behind_relays(relays, generation, stock_rpc, rpc_latency_ms)
        _bench(workloads=workloads, prompts=prompts, methods=methods, draft_len=draft_len, runs=runs,
               max_tokens=max_tokens, json_path=json_path, csv_path=csv_path, plot_path=plot_path, quick=quick,
               write_profile=write_profile, vs_llama_cpp=vs_llama_cpp, stock_rpc=stock_rpc, generation=generation)


def _behind_relays(relays: contextlib.ExitStack, generation: o.GenerationOptions, stock_rpc: str | None,
                   rtt_ms: float) -> tuple[o.GenerationOptions, str | None]:
    """``generation`` and ``stock_rpc`` with each server replaced by a latency relay in front of it."""
    if generation.rpc is None:
        raise UsageError("--rpc-latency-ms needs --rpc HOST:PORT[,HOST:PORT] on the command line")

    def relayed(servers: str) -> str:
        addresses = []
        for server in parse_layout(servers).servers:
            host, _, port = server.rpartition(":")
            if host not in ("127.0.0.1", "localhost"):
                raise UsageError(f"--rpc-latency-ms relays loopback servers only, not {server}; use a real network")
            addresses.append(relays.enter_context(LatencyRelay((host, int(port)), rtt_ms=rtt_ms)).address)
        return ",".join(addresses)

    return replace(generation, rpc=relayed(generation.rpc)), None if stock_rpc is None else relayed(stock_rpc)


def _bench(*, workloads: str | None, prompts: Path | None, methods: str | None, draft_len: str, runs: int | None,
           max_tokens: int | None, json_path: Path | None, csv_path: Path | None, plot_path: Path | None,
           quick: bool, write_profile: str | None, vs_llama_cpp: Path | None, stock_rpc: str | None,
           generation: o.GenerationOptions) -> None:
    """The bench itself, with the RPC servers (relayed or not) it was given."""
    chosen = select(
        load_prompt_file(prompts) if prompts else shipped_prompts(),
        _split(workloads) if workloads else None,
        per_workload=1 if quick else None,
    )
    default_methods = QUICK_METHODS if quick or vs_llama_cpp else DEFAULT_METHODS
    configs = _configs(_split(methods or default_methods), _draft_lens(draft_len))
    if write_profile is not None:
        paths.check_component(write_profile, "profile name")
    if vs_llama_cpp is not None:
        compare_with_llama_cpp(
            vs_llama_cpp,
            generation,
            stock_rpc,
            chosen,
            configs,
            runs=runs or (QUICK_RUNS if quick else DEFAULT_RUNS),
            max_tokens=max_tokens or (QUICK_MAX_TOKENS if quick else DEFAULT_MAX_TOKENS),
            json_path=json_path,
            unsupported={"--csv": csv_path, "--plot": plot_path, "--write-profile": write_profile},
            progress=_progress,
            named=bool(workloads or prompts),
        )
        return
    pair, decoder, sampling = generation.open()
    chosen, note = for_target(chosen, decoder.target, named=bool(workloads or prompts))
    if note:
        err.print(note)
    if write_profile is not None and pair.profile is None:
        raise UsageError(
            "--write-profile needs --profile: a profile stores where its models come from, local files do not"
        )
    missing = decoder.controller.missing
    if methods is None:  # the heads at hand are measured too
        configs += _configs([m for m in HEAD_METHODS if not method_missing(m, missing)], _draft_lens(draft_len))
    for config in configs:
        check_method(config.method, missing=missing)
    settings = BenchSettings(
        configs,
        runs=runs or (QUICK_RUNS if quick else DEFAULT_RUNS),
        max_tokens=max_tokens or (QUICK_MAX_TOKENS if quick else DEFAULT_MAX_TOKENS),
        sampling=sampling,
    )
    try:
        with _progress() as progress:
            runner = BenchRunner(decoder, settings, progress=progress)
            result = runner.run(chosen)
        remember_pass_costs(runner.decoders.values())  # as a session does, for the sessions after it
        runner.close()
    finally:
        close_decoder(decoder)  # while --rpc-latency-ms's relays still run

    rows = report.build_rows(result)
    recommendations = report.recommend(rows)
    overall = report.recommend_overall(rows)
    for recommendation in recommendations:
        workload_rows = [r for r in rows if r["workload"] == recommendation.workload]
        out.print(_table(recommendation.workload, workload_rows))
        for row in workload_rows:
            if row["identical"] is False:
                out.prose(f"  {report.row_label(row)} {_difference(row)}")
        if any(r["history"] for r in workload_rows):
            for row in workload_rows[1:]:  # the learning curve: each request's speedup, in order
                speedups = " ".join(_x(p["speedup"]) for p in row["per_prompt"])
                out.prose(f"  {report.row_label(row)} per request: {speedups}")
        out.prose(f"  recommended for {recommendation.workload}: {recommendation.text}")
        out.print()
    out.prose(f"overall: {overall.text}")
    _write_outputs(rows, recommendations, overall, json_path, csv_path, plot_path, _meta(pair, settings))
    if write_profile is not None:
        note = f"defaults from localspec bench: {overall.text}"
        path = write_tuned_profile(write_profile, pair.profile, overall.method, overall.draft_len, note)
        err.print(f"wrote profile {path} (use it with --profile {write_profile})")


def _write_outputs(rows, recommendations, overall, json_path, csv_path, plot_path, meta: dict) -> None:
    if json_path:
        report.write_json(json_path, rows, recommendations, overall, meta)
        err.print(f"wrote {json_path}")
    if csv_path:
        report.write_csv(csv_path, rows)
        err.print(f"wrote {csv_path}")
    if plot_path:
        if report.write_plot(plot_path, rows):
            err.print(f"wrote {plot_path}")
        else:
            err.print(f"no plot written to {plot_path}: matplotlib is not installed (pip install 'localspec[plot]')")


def _meta(pair, settings: BenchSettings) -> dict:
    return {
        "model": pair.label,
        "target": str(pair.target),
        "draft": None if pair.draft is None else str(pair.draft),
        "settings": {
            "runs": settings.runs,
            "max_tokens": settings.max_tokens,
            "temperature": settings.sampling.temperature,
            "greedy": settings.sampling.greedy,
            "configs": [c.label for c in settings.all_configs],
        },
    }


def _table(workload: str, rows: list[dict]) -> Table:
    """One row per method, narrow enough for a terminal or a 100-column log: figures never wrap, and where an
    output differs the table says so and the line after it says where (``_difference``)."""
    first = rows[0]
    shape = f"{first['prompts']} prompt(s) x {first['runs']} run(s)"
    table = Table(
        title=f"{workload}: {shape}, target alone {first['baseline_tok_per_s']:.1f} tok/s",
        box=box.SIMPLE_HEAD, collapse_padding=True, show_edge=False, pad_edge=False, title_justify="left",
    )
    add_columns(
        table,
        ("method", "tok/s", "speedup", "expected", "accepted", "tok/pass", "per position", "passes", "TTFT s", "output"),
        wrapping=("method", "per position"),
        left=("method", "per position", "output"),
    )
    for row in rows:
        positions = " ".join(f"{x:.2f}" for x in row["per_position_acceptance"][:4])
        table.add_row(
            report.row_label(row),
            f"{row['tok_per_s']:.1f}",
            _x(row["speedup"]),
            _x(row["expected_speedup"]),
            f"{row['acceptance_rate']:.0%}" if row["method"] != "none" else "-",
            f"{row['mean_accepted_length']:.2f}",
            positions or "-",
            f"{row['target_passes']:.0f}",
            "-" if row["ttft_s"] is None else f"{row['ttft_s']:.2f}",
            _output(row),
        )
    return table


def _output(row: dict) -> str:
    if row["identical"] is None:
        return "sampled"
    return "identical" if row["identical"] else "differs"


def _difference(row: dict) -> str:
    d = row["first_difference"]
    return f"differs in {d['prompt']} at token {d['index']}: {d['baseline_text']!r} vs {d['speculative_text']!r}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _split(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise UsageError(f"empty list {text!r}: give comma-separated names")
    return items


def _configs(methods: list[str], draft_lens: list[int | None]) -> list[Config]:
    configs = []
    for name in methods:
        method = name.removesuffix(HISTORY_SUFFIX)
        check_method(method)
        if method != name and method != "auto":
            raise UsageError(f"--methods item {name!r}: only auto{HISTORY_SUFFIX} uses an answer history")
        history = method != name
        configs += [Config(method) if method == "none" else Config(method, k, history) for k in draft_lens]
    return list(dict.fromkeys(configs))


def _draft_lens(text: str) -> list[int | None]:
    lengths: list[int | None] = []
    for item in _split(text):
        if item == "auto":
            lengths.append(None)
        elif item.isdigit() and int(item) >= 1:
            lengths.append(int(item))
        else:
            raise UsageError(f"bad --draft-len item {item!r}: use whole numbers of at least 1 or 'auto'")
    return lengths


@contextmanager
def _progress() -> Iterator[ProgressCallback]:
    """Rich progress on stderr for the timed generations; setup steps (total 0) only change the label."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("preparing", total=None)

        def update(what: str, done: int, total: int) -> None:
            if total:
                bar.update(task, description=what, completed=done, total=total)
            else:
                bar.update(task, description=what)

        yield update
