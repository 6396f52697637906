"""Records what the real llama.vim sends in an editing session: vim, typed at through tmux, with the plugin at
its defaults, against stock llama-server through the recording proxy (``scripts.bench.agents record``).

Why a real session: llama.vim's requests follow its timers and its ring of chunks (a warm-up with n_predict
0 each time a queued chunk enters the ring, a completion deferred while one is in flight, a speculative one
after each suggestion shown), which no hand-written list of requests reproduces.

What runs: stock llama-server with the plugins' recommended FIM settings (--fim-qwen-1.5b-default's batches
and cache reuse, -t 2, -c 8192) on the default profile's target, Qwen2.5-Coder 1.5B; the proxy in front of
it on llama.vim's default endpoint port, 8012; vim with no user vimrc (a generated one adds the plugin, taken
from --plugin at --commit, to 'runtimepath' and turns on filetype plugins and indent), in a private tmux
server, on copies of localspec/fim.py and localspec/server/infill.py as committed (HEAD). The session: read
fim.py, duplicate a constant's line and edit the copy, yank a function (a chunk for the ring), write a new
function and accept its body with Tab, save; open infill.py, write a helper, call it in another
function and accept the model's argument, add a docstring, save; back to fim.py (:e #) for a counter, save;
back to infill.py, start a comment and quit (:wq) while a request is in flight, which vim's exit kills. Text
is typed a word at a time with pauses, so the plugin fires as it does for a person. The edits are printed.

Each line of --out is the proxy's (method, path, time, and the body exactly as the plugin sent it), with
"client": "llama.vim <commit>" first; ``{"cancelled_request": N}`` lines mark the requests the client hung up
on, by line number. llama.vim (a1c8e6e) never drops a completion because the user types on (it defers the
next one instead), so hang-ups come from quitting. How many requests a session holds depends on how fast
this machine answers them.

    .venv/bin/python -m scripts.record.llama_vim --out tests/data/editor-sessions/llama-vim.jsonl \\
        [--plugin GIT_DIR_OR_URL] [--commit REV] [--model M.gguf] [--llama-server PATH] [--port 8012] [--quick]
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from scripts.bench.agents import find_llama_server, free_port, server

REPO = Path(__file__).resolve().parents[2]
PLUGIN_URL = "https://github.com/ggml-org/llama.vim"
PLUGIN_COMMIT = "a1c8e6e40cb45df59b78add5b65d575386832465"  # "inst : add support for classic vim" (2026-01-31)
FILES = ("localspec/fim.py", "localspec/server/infill.py")
LLAMA_VIM_PORT = 8012  # llama.vim's default endpoint_fim is http://127.0.0.1:8012/infill
SERVER_ARGS = ["-t", "2", "-ub", "1024", "-b", "1024", "--cache-reuse", "256", "-c", "8192"]
SESSION = "llama-vim"
# The info llama.vim writes after a suggestion it shows (show_info 2): a suggestion is on screen.
SUGGESTION = re.compile(r"\| c: \d+, r: \d+/\d+")
START_S = 60  # for the proxy and vim to come up
SUGGESTION_WAIT_S = 120  # at most, for a suggestion to accept (a cold prompt takes ~30 s on two cores)


class Vim:
    """vim in a detached session of a private tmux server (its socket in the work folder: nobody's own tmux is
    touched, nothing is left behind)."""

    def __init__(self, tmux_socket: Path, rng: random.Random) -> None:
        self.tmux_socket = tmux_socket
        self.rng = rng
        self.accepted = 0

    def tmux(self, *args: str, env: dict | None = None) -> str:
        return subprocess.run(["tmux", "-S", str(self.tmux_socket), "-f", "/dev/null", *args], check=True,
                              capture_output=True, text=True, env=env).stdout

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", SESSION)

    def running(self) -> bool:
        return subprocess.run(["tmux", "-S", str(self.tmux_socket), "has-session", "-t", SESSION],
                              capture_output=True).returncode == 0

    def key(self, name: str, pause: float = 0.5) -> None:
        """A key by its tmux name (Enter, Escape, Tab)."""
        self.tmux("send-keys", "-t", SESSION, name)
        time.sleep(pause)

    def normal(self, keys: str, pause: float = 0.8) -> None:
        """Normal-mode keys, sent as one burst as a person types a command."""
        self.tmux("send-keys", "-t", SESSION, "-l", "--", keys)
        time.sleep(pause)

    def command(self, line: str) -> None:
        """An ex command (":w") or a search ("/pattern"), then Enter."""
        self.normal(line, pause=0.2)
        self.key("Enter", pause=1.0)

    def type(self, text: str) -> None:
        """Insert-mode text a word or a run of other characters at a time, with a typist's pauses; "\\n" is
        Enter, after which the typist thinks a little longer."""
        for group in re.findall(r"\n|\w+|[^\w\n]+", text):
            if group == "\n":
                self.key("Enter", pause=self.rng.uniform(1.0, 2.5))
            else:
                self.tmux("send-keys", "-t", SESSION, "-l", "--", group)
                time.sleep(self.rng.uniform(0.25, 0.8))

    def accept(self, wait_s: float) -> bool:
        """Tab once a suggestion shows (within ``wait_s``); whether one did."""
        if not wait_for(lambda: SUGGESTION.search(self.screen()) is not None, wait_s):
            return False
        self.key("Tab", pause=1.0)
        self.accepted += 1
        return True

    def quit(self, wait_s: float) -> None:
        """:wq at once, with whatever request is in flight, and wait for vim to exit."""
        self.key("Escape", pause=0.3)
        self.command(":wq")
        wait_for(lambda: not self.running(), wait_s)


def wait_for(ready: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not ready():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# -- the session ------------------------------------------------------------------------------------------
def session(vim: Vim, quick: bool) -> None:
    if quick:
        vim.command("/^DEFAULT_CHUNK_FILENAME")
        vim.normal("o")
        vim.type("X = 1")
        vim.key("Escape")
        vim.command(":w")
        vim.command(f":e {FILES[1]}")
        vim.normal("Go")
        vim.type("y = 2")
        vim.quit(10)
        return
    time.sleep(6)  # reading: the file's chunk (queued on entering it) goes into the ring, a warm-up
    # fim.py: a constant made from a duplicated line
    vim.command("/^DEFAULT_CHUNK_FILENAME")
    vim.normal("yyp")
    vim.normal("cw")
    vim.type("MAX_CHUNK_LINES")
    vim.key("Escape")
    vim.normal("$ciW")
    vim.type("32  # half of llama.vim's ring_chunk_size")
    vim.key("Escape")
    time.sleep(3)
    # a function yanked (a chunk for the ring), and a new one written after it, its body the model's
    vim.command("/^def fim_tokens")
    vim.normal("y}")
    time.sleep(4)
    vim.normal("}o")
    vim.type('\ndef chunk_tokens(model: FimModel, chunks: tuple[Chunk, ...]) -> int:\n'
             '"""The tokens the chunks take in a prompt."""\n')
    vim.accept(SUGGESTION_WAIT_S)
    vim.key("Escape")
    vim.command(":w")
    time.sleep(4)
    # infill.py: a helper, then called in _chunks, its argument the model's
    vim.command(f":e {FILES[1]}")
    time.sleep(6)
    vim.command("/^def _max_tokens")
    vim.normal("O")
    vim.type('def _filename(chunk: dict) -> str:\n"""A chunk\'s file name, or llama-server\'s placeholder."""\n'
             'return chunk.get("filename") or "tmp"')
    vim.key("Escape")
    vim.command("/^def _max_tokens")
    vim.normal("O")
    vim.type("\n")
    vim.key("Escape")
    vim.command('/filename = chunk.get("filename")')
    vim.normal("f=wC")
    vim.type("_filename(")
    if not vim.accept(SUGGESTION_WAIT_S):
        vim.type("chunk)")
    vim.key("Escape")
    # a docstring for _stop
    vim.command("/^def _stop")
    vim.normal("o")
    vim.type('"""The stop strings, without the empty ones llama-server skips."""')
    vim.key("Escape")
    vim.command(":w")
    time.sleep(4)
    # back to fim.py (the alternate file) for a counter in CompletionLimits
    vim.command(":e #")
    time.sleep(4)
    vim.command("/self._line_start = 0")
    vim.normal("o")
    vim.type("self._lines = 0  # lines the answer has ended so far")
    vim.key("Escape")
    vim.command("/self._has_new_line = True")
    vim.normal("o")
    vim.type('self._lines += piece.count("\\n")')
    vim.key("Escape")
    vim.command(":w")
    time.sleep(4)
    # infill.py again: a comment begun, and :wq
    vim.command(":e #")
    time.sleep(3)
    vim.command("/skips empty stop strings")
    vim.normal("O")
    vim.type('# llama.vim sends "stop": [] ')
    vim.quit(30)


# -- what it runs on ----------------------------------------------------------------------------------------
def default_model() -> Path:
    from localspec.profiles import DEFAULT_PROFILE, load_profile
    from localspec.store import cache as store

    return store.resolve_model(load_profile(DEFAULT_PROFILE).target, offline=True)


def plugin_tree(source: str, commit: str, dest: Path) -> str:
    """The plugin's files at ``commit`` in ``dest``; returns its short hash. ``source``: a local git
    repository (bare or not) or a URL to clone."""
    repository = Path(source)
    if not repository.exists():
        repository = dest.with_suffix(".git")
        subprocess.run(["git", "clone", "--quiet", "--bare", source, str(repository)], check=True)
    dest.mkdir()
    archive = subprocess.run(["git", "-C", str(repository), "archive", commit], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return subprocess.run(["git", "-C", str(repository), "rev-parse", "--short=7", commit], check=True,
                          capture_output=True, text=True).stdout.strip()


def project_copy(dest: Path) -> dict[str, str]:
    """The files edited, as committed (the session starts from the same text whatever the work tree holds);
    returns their texts."""
    texts = {}
    for name in FILES:
        texts[name] = subprocess.run(["git", "-C", str(REPO), "show", f"HEAD:{name}"], check=True,
                                     capture_output=True, text=True).stdout
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_text(texts[name])
    return texts


def edits(project: Path, before: dict[str, str]) -> str:
    """What the session left in the files (the typed text and the suggestions accepted), as a diff."""
    return "".join("".join(difflib.unified_diff(text.splitlines(True), (project / name).read_text().splitlines(True),
                                                name, name)) for name, text in before.items())


def vimrc(plugin: Path, port: int) -> str:
    """A Python programmer's few settings and the plugin; its config stays at the defaults but for a
    non-default port."""
    rc = (f"set nocompatible\nset runtimepath+={plugin}\nfiletype plugin indent on\nsyntax on\n"
          "set noswapfile nobackup laststatus=2 ruler ttimeoutlen=50\n")
    if port != LLAMA_VIM_PORT:
        rc += f"let g:llama_config = {{'endpoint_fim': 'http://127.0.0.1:{port}/infill'}}\n"
    return rc


@contextmanager
def recording_proxy(upstream: str, port: int, out: Path, log: Path) -> Iterator[None]:
    if listening(port):
        raise SystemExit(f"port {port} is in use: stop what listens there or pass --port")
    with log.open("w") as log_file:
        proxy = subprocess.Popen([sys.executable, "-m", "scripts.bench.agents", "record", "--upstream", upstream,
                                  "--port", str(port), "--out", str(out)], cwd=REPO, stdout=log_file,
                                 stderr=subprocess.STDOUT)
    try:
        if not wait_for(lambda: listening(port) or proxy.poll() is not None, START_S) or proxy.poll() is not None:
            raise SystemExit(f"the recording proxy did not start; see {log}")
        yield
    finally:
        proxy.terminate()
        proxy.wait(30)


@contextmanager
def vim_in_tmux(project: Path, vimrc_path: Path, home: Path, rng: random.Random) -> Iterator[Vim]:
    vim = Vim(home.parent / "tmux.sock", rng)
    # No user configuration (HOME is a fresh folder), and curl reaches the proxy directly.
    env = {**os.environ, "HOME": str(home), "no_proxy": "127.0.0.1", "NO_PROXY": "127.0.0.1"}
    try:
        vim.tmux("new-session", "-d", "-s", SESSION, "-x", "160", "-y", "50", "-c", str(project),
                 shlex.join(["vim", "-N", "-u", str(vimrc_path), "-i", "NONE", FILES[0]]), env=env)
        # On vim 9.0 the plugin warns that it wants 9.1 before the file shows: Enter, as its user would.
        if not wait_for(lambda: FILES[0] in vim.screen() or "Press ENTER" in vim.screen(), START_S):
            raise SystemExit("vim did not start in its tmux terminal")
        if "Press ENTER" in vim.screen():
            vim.key("Enter")
        yield vim
    finally:
        subprocess.run(["tmux", "-S", str(vim.tmux_socket), "kill-server"], capture_output=True)


def summary(lines: list[dict], accepted: int) -> str:
    requests = [line["body"] for line in lines if line.get("path") == "/infill" and isinstance(line.get("body"), dict)]
    warm_ups = sum(body.get("n_predict") == 0 for body in requests)
    cancelled = sum("cancelled_request" in line for line in lines)
    return (f"{len(requests)} /infill requests: {warm_ups} warm-ups (n_predict 0), {len(requests) - warm_ups} "
            f"completions, {cancelled} hung up on; {accepted} suggestion(s) accepted with Tab")


def record(args: argparse.Namespace) -> None:
    missing = [tool for tool in ("vim", "tmux", "git", "curl") if shutil.which(tool) is None]
    if missing:
        raise SystemExit(f"needs {', '.join(missing)} (llama.vim runs in vim, in a tmux terminal, and sends with curl)")
    model = args.model or default_model()
    llama_server = args.llama_server or find_llama_server()
    work = Path(tempfile.mkdtemp(prefix="record-llama-vim-"))
    done = False
    try:
        commit = plugin_tree(args.plugin, args.commit, work / "llama.vim")
        before = project_copy(work / "project")
        (work / "home").mkdir()
        (work / "vimrc").write_text(vimrc(work / "llama.vim", args.port))
        raw = work / "requests.jsonl"
        port = free_port()
        command = [llama_server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *SERVER_ARGS]
        with (server(command, port, dict(os.environ), work / "llama-server.log") as base,
              recording_proxy(base, args.port, raw, work / "proxy.log"),
              vim_in_tmux(work / "project", work / "vimrc", work / "home", random.Random(args.seed)) as vim):
            session(vim, args.quick)
            time.sleep(2)  # the proxy notes the hang-ups of vim's exit
        lines = [json.loads(line) for line in raw.read_text().splitlines()] if raw.exists() else []
        client = f"llama.vim {commit}"
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps({"client": client, **line}) + "\n" for line in lines))
        print(f"{args.out}: {summary(lines, vim.accepted)}\n{edits(work / 'project', before)}")
        done = True
    finally:
        if done:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"logs and the edited files kept in {work}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the recording (JSONL), replaced")
    parser.add_argument("--plugin", default=PLUGIN_URL, help="llama.vim's git repository: a local one (bare or not) "
                        "or a URL to clone [%(default)s]")
    parser.add_argument("--commit", default=PLUGIN_COMMIT, help="the plugin's revision [%(default)s]")
    parser.add_argument("--model", type=Path, help="a FIM model [the default profile's target, Qwen2.5-Coder 1.5B]")
    parser.add_argument("--llama-server", help="the stock llama-server binary [build-llama-cpp-stock's, else PATH]")
    parser.add_argument("--port", type=int, default=LLAMA_VIM_PORT,
                        help="the proxy's port, where llama.vim sends [its default, %(default)s]")
    parser.add_argument("--seed", type=int, default=0, help="for the typing pauses")
    parser.add_argument("--quick", action="store_true", help="a few keystrokes in each file (smoke runs)")
    record(parser.parse_args(argv))


if __name__ == "__main__":
    main()
