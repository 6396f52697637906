"""What `localspec serve` costs and what it gains an agent, with the real CLI and the openai client.

1. Server vs `localspec run` on the same request (greedy): each run starts a fresh `localspec run --json`
   and a fresh `localspec serve`, so neither carries a learned controller; prints decode tok/s as each
   engine reports it and as the client sees the stream, and whether the texts are identical.
2. An agent-style session of 4 turns, for `auto` vs `none`: each turn sends the whole history plus a
   100-line file and asks for an edit, as editors and coding agents do. Prints per turn: wall time,
   prompt tokens, prefix tokens reused from the KV cache, decode tok/s, acceptance; then the speedup.
3. The same edits as a tool-using agent, `auto` vs `none`: per turn the model calls read_file (the file
   comes back as a tool result), then write_file with the whole edited file, then answers in a line.
   Calls are forced by name, so both methods walk the same steps; prints per step and per turn.
4. Forced-token drafting: answers constrained by a JSON schema, `auto` vs `none`, with the tokens the
   grammar drafted and how many were accepted.

    .venv/bin/python -m scripts.bench.server [--profile NAME | --target T --draft D] [--runs 2]
        [--max-tokens 128] [--turn-tokens 256] [--write-tokens 1536] [--threads N] [--ctx 8192]
        [--parts 1,2,3,4]
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


def progress_line(label: str, answer: dict) -> str:
    """One request of a session as it happens: time, prompt and reuse, decode speed, drafts accepted."""
    t = answer["timings"]
    return (f"{label}: {answer['wall_s']:6.1f} s, prompt {answer['usage'].prompt_tokens} (reused {t['cache_n']}), "
            f"{t['predicted_n']} tokens at {t['predicted_per_second']:.1f} tok/s, "
            f"accepted {t['draft_n_accepted']}/{t['draft_n']}")


def acceptance(timings: dict) -> str:
    return f"{timings['draft_n_accepted'] / timings['draft_n']:.0%}" if timings["draft_n"] else "-"


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
                print(progress_line(f"{method:5} turn {turn}", answer), flush=True)
    print(f"\nagent session, 4 turns, {turn_tokens} tokens per answer, auto vs none:")
    print(f"{'turn':>4} {'prompt':>7} {'reused':>7} {'auto s':>7} {'none s':>7} {'speedup':>8} "
          f"{'auto tok/s':>10} {'none tok/s':>10} {'accepted':>9} {'same':>5}")
    for turn, (auto, none) in enumerate(zip(results["auto"], results["none"]), start=1):
        t, n = auto["timings"], none["timings"]
        accepted = acceptance(t)
        print(f"{turn:4d} {auto['usage'].prompt_tokens:7d} {t['cache_n']:7d} {auto['wall_s']:7.1f} "
              f"{none['wall_s']:7.1f} {none['wall_s'] / auto['wall_s']:7.2f}x {t['predicted_per_second']:10.1f} "
              f"{n['predicted_per_second']:10.1f} {accepted:>9} {str(auto['text'] == none['text']):>5}")
    total_auto = sum(a["wall_s"] for a in results["auto"])
    total_none = sum(a["wall_s"] for a in results["none"])
    print(f"session: auto {total_auto:.1f} s, none {total_none:.1f} s, {total_none / total_auto:.2f}x")


AGENT_TOOLS = [
    {"type": "function", "function": {
        "name": "read_file", "description": "Read a file of the project",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"],
                       "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "write_file", "description": "Replace a file of the project with new content",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                       "required": ["path", "content"], "additionalProperties": False}}},
]


def force(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def tool_step(client: openai.OpenAI, history: list[dict], tool_choice, max_tokens: int) -> dict:
    """One request of the agent loop; the answer (with its tool calls) joins the history."""
    start = time.perf_counter()
    answer = client.chat.completions.create(model="local", messages=history, tools=AGENT_TOOLS,
                                            tool_choice=tool_choice, max_tokens=max_tokens, temperature=0)
    wall = time.perf_counter() - start
    message = answer.choices[0].message
    history.append(message.model_dump(exclude_none=True))
    return {"wall_s": wall, "timings": answer.model_extra["timings"], "usage": answer.usage,
            "calls": message.tool_calls or [], "text": message.content or ""}


def tool_agent_session(model_args: list[str], write_tokens: int) -> None:
    results: dict[str, list[list[dict]]] = {}
    for method in ("auto", "none"):
        file = inventory_file()  # each method edits its own copy, so both read the same file each turn
        history: list[dict] = [{"role": "system", "content": "You are a careful coding agent. Use the tools."}]
        with serving(model_args, method) as client:
            for turn, edit in enumerate(EDITS, start=1):
                history.append({"role": "user", "content": f"In inventory.py: {edit}"})
                steps = [tool_step(client, history, force("read_file"), 64)]
                for call in steps[-1]["calls"]:
                    history.append({"role": "tool", "tool_call_id": call.id, "content": file})
                steps.append(tool_step(client, history, force("write_file"), write_tokens))
                for call in steps[-1]["calls"]:
                    history.append({"role": "tool", "tool_call_id": call.id, "content": "written"})
                    file = json.loads(call.function.arguments).get("content", file)
                steps.append(tool_step(client, history, "auto", 64))
                results.setdefault(method, []).append(steps)
                for name, step in zip(("read", "write", "answer"), steps):
                    print(f"{progress_line(f'{method:5} turn {turn} {name:6}', step)} "
                          f"{json.dumps(step['timings']['by_source'])}", flush=True)
    print(f"\ntool-using agent, {len(EDITS)} turns (read_file, write_file, answer), auto vs none:")
    print(f"{'turn':>4} {'step':>6} {'prompt':>7} {'reused':>7} {'auto s':>7} {'none s':>7} {'speedup':>8} "
          f"{'accepted':>9} {'grammar':>9} {'same':>5}")
    for turn, (auto, none) in enumerate(zip(results["auto"], results["none"]), start=1):
        for name, a, n in zip(("read", "write", "answer"), auto, none):
            t = a["timings"]
            accepted = acceptance(t)
            grammar = t["by_source"].get("grammar", {})
            forced = f"{grammar.get('accepted', 0)}/{grammar.get('drafted', 0)}"
            same = a["text"] == n["text"] and [c.function.arguments for c in a["calls"]] == [
                c.function.arguments for c in n["calls"]]
            print(f"{turn:4d} {name:>6} {a['usage'].prompt_tokens:7d} {t['cache_n']:7d} {a['wall_s']:7.1f} "
                  f"{n['wall_s']:7.1f} {n['wall_s'] / a['wall_s']:7.2f}x {accepted:>9} {forced:>9} {str(same):>5}")
    total_auto = sum(s["wall_s"] for turn in results["auto"] for s in turn)
    total_none = sum(s["wall_s"] for turn in results["none"] for s in turn)
    print(f"session: auto {total_auto:.1f} s, none {total_none:.1f} s, {total_none / total_auto:.2f}x")


SCHEMA_PROMPTS = [
    "Describe the function `load_items` in inventory.py.",
    "Plan the refactor that renames `Item` to `StockItem`.",
    "Which totals in inventory.py ignore items out of stock?",
    "List the risks of parsing CSV with float().",
]
REVIEW_SCHEMA = {"type": "object", "properties": {
    "summary": {"type": "string"}, "risk": {"enum": ["low", "medium", "high"]},
    "files": {"type": "array", "items": {"type": "string"}, "maxItems": 4},
    "steps": {"type": "array", "items": {"type": "string"}, "maxItems": 5}},
    "required": ["summary", "risk", "files", "steps"], "additionalProperties": False}


def schema_answers(model_args: list[str], max_tokens: int) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "review", "schema": REVIEW_SCHEMA, "strict": True}}
    rows: dict[str, list[dict]] = {}
    for method in ("auto", "none"):
        with serving(model_args, method) as client:
            for prompt in SCHEMA_PROMPTS:
                messages = [{"role": "user", "content": f"Here is `inventory.py`:\n\n```python\n{inventory_file()}```"
                                                        f"\n\n{prompt} Answer in JSON."}]
                start = time.perf_counter()
                answer = client.chat.completions.create(model="local", messages=messages, response_format=fmt,
                                                        max_tokens=max_tokens, temperature=0)
                rows.setdefault(method, []).append({"wall_s": time.perf_counter() - start,
                                                    "timings": answer.model_extra["timings"],
                                                    "text": answer.choices[0].message.content})
    print(f"\njson_schema answers ({len(SCHEMA_PROMPTS)} prompts, up to {max_tokens} tokens), auto vs none:")
    print(f"{'#':>2} {'tokens':>6} {'auto tok/s':>10} {'none tok/s':>10} {'speedup':>8} {'grammar':>9} "
          f"{'other':>9} {'same':>5}")
    for i, (a, n) in enumerate(zip(rows["auto"], rows["none"]), start=1):
        t = a["timings"]
        grammar = t["by_source"].get("grammar", {})
        other_drafted = t["draft_n"] - grammar.get("drafted", 0)
        other_accepted = t["draft_n_accepted"] - grammar.get("accepted", 0)
        print(f"{i:2d} {t['predicted_n']:6d} {t['predicted_per_second']:10.1f} "
              f"{n['timings']['predicted_per_second']:10.1f} {n['wall_s'] / a['wall_s']:7.2f}x "
              f"{grammar.get('accepted', 0):>4}/{grammar.get('drafted', 0):<4} {other_accepted:>4}/{other_drafted:<4} "
              f"{str(a['text'] == n['text']):>5}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile")
    parser.add_argument("--target")
    parser.add_argument("--draft")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per answer in the server-vs-run part")
    parser.add_argument("--turn-tokens", type=int, default=256, help="tokens per answer in the agent session")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--write-tokens", type=int, default=1536,
                        help="tokens for the write_file call of the tool-using agent (the whole file, JSON-escaped)")
    parser.add_argument("--parts", default="1,2,3,4", help="which parts to run (see above), comma-separated")
    args = parser.parse_args(argv)
    model_args = ["--ctx", str(args.ctx)]
    for flag in ("profile", "target", "draft", "threads"):
        if getattr(args, flag) is not None:
            model_args += [f"--{flag}", str(getattr(args, flag))]
    parts = {int(p) for p in args.parts.split(",")}
    if 1 in parts:
        server_vs_run(model_args, args.runs, args.max_tokens)
    if 2 in parts:
        print()
        agent_session(model_args, args.turn_tokens)
    if 3 in parts:
        print()
        tool_agent_session(model_args, args.write_tokens)
    if 4 in parts:
        schema_answers(model_args, args.max_tokens * 2)


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\n(total {time.perf_counter() - start:.0f} s)")
