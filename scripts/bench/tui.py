"""What the live view costs: tok/s with the view on vs plain streaming, in one run, in a real terminal.

Starts itself inside a detached tmux terminal (so the view renders to a real terminal emulator, whose
CPU use counts too), loads the pair once, and alternates plain and live answers to the same prompt.
Speed is wall-clock tokens per second from the first token to the last, so rendering time counts.

    .venv/bin/python -m scripts.bench.tui [--profile NAME | --target T --draft D] [--reps 3] [-n 160] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from time import perf_counter

PROMPT = (
    "Here is a function:\n\ndef mean(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)\n\n"
    "Rewrite it with type hints and a docstring, and make it raise ValueError on an empty list. Code only."
)


def measure(args: argparse.Namespace) -> dict:
    from rich.console import Console

    from localspec.cli.options import GenerationOptions
    from localspec.conversation import Conversation
    from localspec.tui import LiveView

    options = GenerationOptions(profile=args.profile, target=args.target, draft=args.draft, method=args.method,
                                threads=args.threads)
    _, decoder, sampling = options.open()
    console = Console(highlight=False, soft_wrap=True)

    def answer(live: bool) -> tuple[float, float]:
        """Tokens per second, and the share of the time spent outside the decoder (rendering, writing)."""
        pieces = Conversation(decoder).ask(PROMPT, max_tokens=args.max_tokens, sampling=sampling)
        next(pieces)  # the prompt is read once and then comes from the KV cache: time decoding only
        start = perf_counter()
        if live:
            LiveView(console, decoder).stream(pieces)
        else:
            for piece in pieces:
                sys.stdout.write(piece.text)
                sys.stdout.flush()
            sys.stdout.write("\n")
        wall = perf_counter() - start
        return (decoder.stats.generated_tokens - 1) / wall, 1 - decoder.stats.decode_s / wall

    answer(live=False)  # warm-up: prefill and the controller's first measurements
    rates: dict[str, list[tuple[float, float]]] = {"plain": [], "live": []}
    for rep in range(args.reps):
        # Alternate the order so a drift in machine load does not favour one mode.
        for mode in (("plain", "live") if rep % 2 == 0 else ("live", "plain")):
            rates[mode].append(answer(live=mode == "live"))
    return rates


def in_terminal(argv: list[str]) -> dict:
    tmux = shutil.which("tmux")
    if tmux is None:
        sys.exit("scripts.bench.tui: needs tmux (apt-get install -y tmux) to give the view a real terminal")
    out = Path(tempfile.mkdtemp()) / "rates.json"
    session = f"bench-tui-{int(time.time())}"
    command = shlex.join([sys.executable, "-m", "scripts.bench.tui", "--inner", str(out), *argv])
    # Started where this run was, so the module and relative model paths resolve as they did here, and in its
    # home (a tmux server already running would give the session the server's environment).
    home = os.environ.get("LOCALSPEC_HOME")
    env = ["-e", f"LOCALSPEC_HOME={home}"] if home else []
    subprocess.run([tmux, "new-session", "-d", "-s", session, "-c", os.getcwd(), *env, "-x", "120", "-y", "40",
                    command], check=True)
    try:
        while not out.exists():
            if subprocess.run([tmux, "has-session", "-t", session], capture_output=True).returncode != 0:
                sys.exit("scripts.bench.tui: the measurement ended without a result (run it with --inner FILE to "
                         "see why)")
            time.sleep(1)
        return json.loads(out.read_text())
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile")
    parser.add_argument("--target", type=Path)
    parser.add_argument("--draft", type=Path)
    parser.add_argument("--method")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("-n", "--max-tokens", type=int, default=160)
    parser.add_argument("--inner", type=Path, help=argparse.SUPPRESS)  # where the in-terminal run writes its rates
    args, _ = parser.parse_known_args(argv)
    if args.inner:
        partial = args.inner.with_suffix(".partial")  # the outer run reads the file once it exists: whole
        partial.write_text(json.dumps(measure(args)))
        partial.rename(args.inner)
        return
    rates = in_terminal(argv)
    for mode in ("plain", "live"):
        runs = rates[mode]
        print(f"{mode:>5}: " + ", ".join(f"{r:.2f}" for r, _ in runs) + " tok/s; time outside the decoder "
              + ", ".join(f"{o:.1%}" for _, o in runs))
    # Each rep's two runs are adjacent in time, so their ratio is the least disturbed by load changes.
    ratio = statistics.median(live[0] / plain[0] for live, plain in zip(rates["live"], rates["plain"]))
    extra = statistics.median(live[1] - plain[1] for live, plain in zip(rates["live"], rates["plain"]))
    print(f"median live/plain tok/s = {ratio:.3f}; the view's extra share of the time = {extra:+.2%}")


if __name__ == "__main__":
    main()
