#!/usr/bin/env python3
"""What `localspec serve` costs and what it gains an agent, with the real CLI and the openai client.

1. Server vs `localspec run` on the same request (greedy): each run starts a fresh `localspec run --json`
   and a fresh `localspec serve`, so neither carries a learned controller; prints decode tok/s as each
   engine reports it and as the client sees the stream, and whether the texts are identical.
2. An agent-style session of 4 turns, for `auto` vs `none`: each turn sends the whole history plus a
   100-line file and asks for an edit, as editors and coding agents do. Prints per turn: wall time,
   prompt tokens, prefix tokens reused from the KV cache, decode tok/s, acceptance; then the speedup.

    .venv/bin/python scripts/bench_server.py [--profile NAME | --target T --draft D] [--runs 2]
        [--max-tokens 128] [--turn-tokens 256] [--threads N] [--ctx 8192]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager

import openai

EDITS = [
    "Rename the class `Item` to `StockItem` everywhere.",
    "Make `load_items` skip rows whose quantity is negative.",
    "Add a `-> float` return annotation to every function that returns a total.",
    "Add a one-line docstring to the class.",
]
FIELDS = ["quantity", "price", "weight", "volume", "cost", "margin", "discount"]


def inventory_file() -> str:
    """A 100-line Python module, the kind of file an agent sends with every turn."""
    lines = [
        '"""Inventory records: loading, validation and totals."""',
        "",
        "import csv",
        "from dataclasses import dataclass",
        "from pathlib import Path",
        "",
        "",
        "@dataclass",
        "class Item:",
        "    sku: str",
        "    name: str",
        *[f"    {field}: float" for field in FIELDS],
        "",
        "",
        "def load_items(path):",
        "    items = []",
        '    with Path(path).open(newline="") as handle:',
        "        for row in csv.DictReader(handle):",
        "            values = {field: float(row[field]) for field in FIELDS}",
        '            items.append(Item(row["sku"], row["name"], **values))',
        "    return items",
        "",
        "",
        f"FIELDS = {tuple(FIELDS)!r}",
    ]
    for field in FIELDS:
        lines += [
            "",
            f"def total_{field}(items):",
            f'    """Sum of {field} over the items in stock."""',
            "    result = 0.0",
            "    for item in items:",
            "        if item.quantity > 0:",
            f"            result += item.{field}",
            "    return result",
            "",
        ]
    lines += [
        "",
        "def report(items):",
        "    return {field: globals()[f'total_{field}'](items) for field in FIELDS}",
        "",
        "",
        'if __name__ == "__main__":',
        '    print(report(load_items("inventory.csv")))',
    ]
    return "\n".join(lines) + "\n"


def turn_message(edit: str) -> str:
    return f"Here is `inventory.py`:\n\n```python\n{inventory_file()}```\n\n{edit} Return the complete file as code only."


@contextmanager
def serving(model_args: list[str], method: str):
    """A fresh `localspec serve` on a free port; yields an openai client for it."""
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, "-m", "localspec", "serve", "--port", "0", "--method", method,
                             *model_args], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = proc.stdout.readline()
        if " at http" not in line:
            log.seek(0)
            raise SystemExit(f"localspec serve did not start:\n{log.read()}")
        yield openai.OpenAI(base_url=line.rsplit(" at ", 1)[1].strip(), api_key="unused", timeout=3600,
                            max_retries=0)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def stream_chat(client: openai.OpenAI, messages: list[dict], max_tokens: int) -> dict:
    """One streamed greedy answer: text, the server's timings and usage, and the client's clock."""
    start = time.perf_counter()
    first = last = None
    pieces, final = [], None
    for chunk in client.chat.completions.create(model="local", messages=messages, max_tokens=max_tokens,
                                                temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            final = chunk
    timings, usage = final.model_extra["timings"], final.usage
    streamed = (usage.completion_tokens - 1) / (last - first) if last and last > first else 0.0
    return {"text": "".join(pieces), "timings": timings, "usage": usage, "wall_s": time.perf_counter() - start,
            "streamed_tok_s": streamed}


def run_cli(model_args: list[str], prompt: str, max_tokens: int) -> dict:
    result = subprocess.run([sys.executable, "-m", "localspec", "run", "--json", "--temp", "0", "-n", str(max_tokens),
                             *model_args, prompt], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"localspec run failed: {result.stderr.strip()}")
    return json.loads(result.stdout)


def server_vs_run(model_args: list[str], runs: int, max_tokens: int) -> None:
    prompt = turn_message(EDITS[0])
    rows = []
    for run in range(runs):
        cli = run_cli(model_args, prompt, max_tokens)
        with serving(model_args, "auto") as client:
            served = stream_chat(client, [{"role": "user", "content": prompt}], max_tokens)
        rows.append((cli["stats"]["decode_tok_per_s"], served["timings"]["predicted_per_second"],
                     served["streamed_tok_s"], cli["text"] == served["text"]))
        print(f"run {run}: run {rows[-1][0]:.1f} tok/s, serve {rows[-1][1]:.1f} (engine) / {rows[-1][2]:.1f} "
              f"(client) tok/s, identical {rows[-1][3]}", flush=True)
    run_tps, serve_tps, client_tps = (statistics.median(r[i] for r in rows) for i in range(3))
    print(f"\nserver vs run, {max_tokens} tokens, method auto, median of {runs}:")
    print(f"  localspec run          {run_tps:7.1f} tok/s")
    print(f"  serve (engine timings) {serve_tps:7.1f} tok/s  {serve_tps / run_tps - 1:+.1%}")
    print(f"  serve (client stream)  {client_tps:7.1f} tok/s  {client_tps / run_tps - 1:+.1%}")
    print(f"  identical text in every run: {all(r[3] for r in rows)}")


def agent_session(model_args: list[str], turn_tokens: int) -> None:
    results: dict[str, list[dict]] = {}
    for method in ("auto", "none"):
        history: list[dict] = [{"role": "system", "content": "You are a careful coding assistant."}]
        with serving(model_args, method) as client:
            for turn, edit in enumerate(EDITS, start=1):
                history.append({"role": "user", "content": turn_message(edit)})
                answer = stream_chat(client, history, turn_tokens)
                history.append({"role": "assistant", "content": answer["text"]})
                results.setdefault(method, []).append(answer)
                t = answer["timings"]
                print(f"{method:5} turn {turn}: {answer['wall_s']:6.1f} s, prompt {answer['usage'].prompt_tokens} "
                      f"(reused {t['cache_n']}), {t['predicted_n']} tokens at {t['predicted_per_second']:.1f} tok/s, "
                      f"accepted {t['draft_n_accepted']}/{t['draft_n']}", flush=True)
    print(f"\nagent session, 4 turns, {turn_tokens} tokens per answer, auto vs none:")
    print(f"{'turn':>4} {'prompt':>7} {'reused':>7} {'auto s':>7} {'none s':>7} {'speedup':>8} "
          f"{'auto tok/s':>10} {'none tok/s':>10} {'accepted':>9} {'same':>5}")
    for turn, (auto, none) in enumerate(zip(results["auto"], results["none"]), start=1):
        t, n = auto["timings"], none["timings"]
        accepted = f"{t['draft_n_accepted'] / t['draft_n']:.0%}" if t["draft_n"] else "-"
        print(f"{turn:4d} {auto['usage'].prompt_tokens:7d} {t['cache_n']:7d} {auto['wall_s']:7.1f} "
              f"{none['wall_s']:7.1f} {none['wall_s'] / auto['wall_s']:7.2f}x {t['predicted_per_second']:10.1f} "
              f"{n['predicted_per_second']:10.1f} {accepted:>9} {str(auto['text'] == none['text']):>5}")
    total_auto = sum(a["wall_s"] for a in results["auto"])
    total_none = sum(a["wall_s"] for a in results["none"])
    print(f"session: auto {total_auto:.1f} s, none {total_none:.1f} s, {total_none / total_auto:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per answer in the server-vs-run part")
    parser.add_argument("--turn-tokens", type=int, default=256, help="tokens per answer in the agent session")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--ctx", type=int, default=8192)
    args = parser.parse_args()
    model_args = ["--ctx", str(args.ctx)]
    for flag in ("profile", "target", "draft", "threads"):
        if getattr(args, flag) is not None:
            model_args += [f"--{flag}", str(getattr(args, flag))]
    server_vs_run(model_args, args.runs, args.max_tokens)
    print()
    agent_session(model_args, args.turn_tokens)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\n(total {time.perf_counter() - start:.0f} s)")
