"""llama.vscode's /infill requests for the recorded llama.vim session: the same edits, cursor contexts and
times, in the shapes llama.vscode 0.0.63 sends. DERIVED, NOT CAPTURED: VS Code cannot run here, so each
request is built from llama.vscode's source (src/llama-server.ts createRequestPayload, src/completion.ts,
src/extra-context.ts, src/configuration.ts's defaults) applied to a request of the llama.vim recording.

- A completion for each llama.vim completion (n_predict > 0), at its time and cursor context: both plugins
  build input_prefix, input_suffix and prompt alike (256 lines before the cursor line, 64 after, the cursor
  line split at the cursor, a whitespace-only line's prompt empty). llama.vim's speculative completion after
  a suggestion shows (the context as if it were accepted) stands for llama.vscode's cacheFutureSuggestion.
  The fields are llama.vscode's: n_cmpl 3 (max_parallel_completions), top_p 0.99, t_max_predict_ms 2500,
  n_indent the cursor line's indentation and left out when 0 (its ``...(nindent && ...)``; on a
  whitespace-only line llama.vim's request no longer holds the whitespace, so 0 there), no stop, model or
  response_fields (the model is the endpoint's default, empty, so left out).
- A warm-up for each llama.vim ring update (n_predict 0), at its time and with its chunks: llama.vscode's
  periodicRingBufferUpdate sends one each ring_update_ms while chunks are queued and no completion began in
  the last 3 s: empty prefix, suffix and prompt, samplers [], t_max_prompt_ms 500, t_max_predict_ms 1.
- Chunks are ``{text, time, filename}`` as llama.vscode's pickChunk makes them: time in Date.now()
  milliseconds (llama.vim's reltime of the pick), filename the document's absolute path (WORKSPACE + the
  name llama.vim sent). Their texts, and which are in the ring, are llama.vim's: llama.vscode picks and evicts
  by like rules (32-line picks, similar chunks evicted), but not the same random lines.
- No hang-ups: llama.vscode never aborts its axios request (a new completion waits for the one in flight),
  so the requests llama.vim dropped are here sent and answered.

    .venv/bin/python -m scripts.record.llama_vscode [--session tests/data/editor-sessions/llama-vim.jsonl] \\
        [--out tests/data/editor-sessions/llama-vscode.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SESSIONS = REPO / "tests" / "data" / "editor-sessions"
CLIENT = "llama.vscode 0.0.63 (request shapes from source)"
WORKSPACE = "/home/dev/localspec/"  # VS Code's documents are named by absolute path
# configuration.ts's defaults.
N_PREDICT, MAX_PARALLEL_COMPLETIONS, T_MAX_PROMPT_MS, T_MAX_PREDICT_MS = 128, 3, 500, 2500


def chunk(vim_chunk: dict) -> dict:
    seconds, microseconds = vim_chunk["time"]  # vim's reltime(), since the epoch
    return {"text": vim_chunk["text"], "time": seconds * 1000 + microseconds // 1000,
            "filename": WORKSPACE + vim_chunk["filename"]}


def warm_up(chunks: list[dict]) -> dict:
    """createRequestPayload(noPredict=true, "", "", chunks, "", model)."""
    return {"id_slot": 0, "input_prefix": "", "input_suffix": "", "input_extra": chunks, "prompt": "", "n_predict": 0,
            "samplers": [], "cache_prompt": True, "t_max_prompt_ms": T_MAX_PROMPT_MS, "t_max_predict_ms": 1}


def completion(prefix: str, suffix: str, prompt: str, chunks: list[dict]) -> dict:
    """createRequestPayload(noPredict=false, ...), with completion.ts's nindent for the cursor line."""
    line = prompt + suffix.split("\n", 1)[0]
    nindent = len(line) - len(line.lstrip())
    return {"id_slot": 0, "input_prefix": prefix, "input_suffix": suffix, "input_extra": chunks, "prompt": prompt,
            "n_predict": N_PREDICT, "n_cmpl": MAX_PARALLEL_COMPLETIONS,
            "top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True,
            **({"n_indent": nindent} if nindent else {}),
            "t_max_prompt_ms": T_MAX_PROMPT_MS, "t_max_predict_ms": T_MAX_PREDICT_MS}


def derive(vim_lines: list[dict]) -> list[dict]:
    """llama.vscode's request for each /infill request of the llama.vim recording, in order."""
    lines = []
    for line in vim_lines:
        body = line.get("body")
        if line.get("path") != "/infill" or not isinstance(body, dict):
            continue
        chunks = [chunk(c) for c in body.get("input_extra", [])]
        sent = warm_up(chunks) if body.get("n_predict") == 0 else completion(
            body["input_prefix"], body["input_suffix"], body.get("prompt", ""), chunks)
        lines.append({"client": CLIENT, "method": "POST", "path": "/infill", "time": line["time"], "body": sent})
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--session", type=Path, default=SESSIONS / "llama-vim.jsonl",
                        help="the llama.vim recording [%(default)s]")
    parser.add_argument("--out", type=Path, default=SESSIONS / "llama-vscode.jsonl", help="[%(default)s], replaced")
    args = parser.parse_args(argv)
    lines = derive([json.loads(line) for line in args.session.read_text().splitlines() if line.strip()])
    args.out.write_text("".join(json.dumps(line) + "\n" for line in lines))
    warm_ups = sum(line["body"]["n_predict"] == 0 for line in lines)
    print(f"{args.out}: {len(lines)} /infill requests: {warm_ups} warm-ups, {len(lines) - warm_ups} completions")


if __name__ == "__main__":
    main()
