"""A prompt cache across conversations: the model states of recent prompts, in memory and on disk.

Before a prompt is prefilled, ``restore`` puts back the kept state that shares the longest usable prefix
with it, so only the rest is evaluated; after a generation, ``keep`` saves the model's state. An agent's
side requests (a title agent, a sub-agent, a second client) then no longer cost the next turn its whole
prompt, and a restarted server finds an agent's system prompt and tools on disk.

Memory and disk have a bound each, least recently used out first; neither grows past it. A file is used
only when its identity (weights, context layout, kernels, build: ``Model.state_identity``) is this
model's and its checksum holds: a damaged file is deleted, a foreign one is never read back and ages out.
Writes go to a temporary file renamed over the old one, so a file is whole or absent.

A KV cache can cut a restored state anywhere, so any common prefix is usable. A recurrent or hybrid state
cannot be cut (llama.cpp refuses, see engine.llama.model.Model.rollback): it is restored only where it was
saved, when its tokens are a prefix of the prompt.

Outputs: a restored state is, bit for bit, the one the earlier request's prefill built, so an answer is
the one a server that had just served that earlier request (and kept its KV cache) would give. It can
differ in the last bits from a cold prefill of the whole prompt, as it already could with the single KV
cache: llama.cpp's prefill kernels are not batch-invariant, and a cold prefill computes the prefix's
last positions in another batch (with the rest of the prompt) than the earlier request did.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import time
import weakref
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter

import numpy as np

from localspec.engine.llama.model import Model
from localspec.engine.tokens import common_prefix_length
from localspec.errors import LocalspecError
from localspec.gguf.memory import MemoryKind
from localspec.paths import temp_beside

MIB = 2**20
DEFAULT_RAM_MIB = 8192  # llama-server's --cache-ram default
DEFAULT_DISK_MIB = 4096
SUFFIX = ".state"
_MAGIC = b"LSSTATE1"
# magic, identity bytes, tokens, state bytes, crc32 of identity + tokens + state
_HEADER = struct.Struct("<8sIIQI")
_PRIVATE_DIR = 0o700
_READ_CHUNK = 64 * MIB
_STALE_PART_S = 3600  # a temporary file this old is no write in progress

log = logging.getLogger("localspec.prompt_cache")


@dataclass
class _Entry:
    identity: str
    tokens: list[int]
    size: int  # bytes of the state
    state: bytearray | None = None  # held in memory
    file: Path | None = None  # written to disk


@dataclass(frozen=True)
class Restored:
    """What ``restore`` brought back."""

    tokens: int  # leading prompt tokens the restored state holds: the prefill starts after them
    source: str  # "memory" or "disk"
    seconds: float


class PromptCache:
    """Model states of recent prompts, keyed by model identity and tokens; used by one thread at a time.

    Args:
        directory: where states are kept on disk (None: memory only).
        ram_bytes: bound of the states held in memory (0: none are).
        disk_bytes: bound of the state files in ``directory``, whatever model wrote them (0: none are written).
    """

    def __init__(self, directory: Path | None, *, ram_bytes: int, disk_bytes: int) -> None:
        self.directory = directory if disk_bytes > 0 else None
        self.ram_bytes = ram_bytes
        self.disk_bytes = disk_bytes
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._ram_used = 0
        self._identities: weakref.WeakKeyDictionary[Model, str] = weakref.WeakKeyDictionary()
        self._indexed: set[str] = set()  # identities whose files on disk are in _entries

    @property
    def ram_used(self) -> int:
        return self._ram_used

    def disk_used(self) -> int:
        return sum(size for _, size, _ in self._files())

    def entries(self, model: Model) -> list[tuple[int, bool, bool]]:
        """(tokens, in memory, on disk) of this model's kept states, least recently used first."""
        identity = self._identity(model)
        return [(len(e.tokens), e.state is not None, e.file is not None)
                for e in self._entries.values() if e.identity == identity]

    # -- use ---------------------------------------------------------------------------------------
    def restore(self, model: Model, prompt: Sequence[int]) -> Restored | None:
        """Restore the kept state that lets ``model`` skip the most of ``prompt``'s prefill, if it beats what
        the model holds already; None when nothing was restored."""
        identity = self._identity(model)
        exact = model.memory_plan.memory != MemoryKind.KV
        held = usable_prefix(model.tokens, prompt, exact=exact)
        candidates = sorted(
            ((usable_prefix(e.tokens, prompt, exact=exact), key) for key, e in self._entries.items()
             if e.identity == identity),
            reverse=True,
        )
        for reused, key in candidates:
            if reused <= held:
                break
            started = perf_counter()
            entry = self._entries[key]
            source, state = "memory", entry.state
            if state is None:
                source, held_too = "disk", entry.size <= self.ram_bytes
                if held_too:
                    self._make_room(entry.size)  # before the read, so the states held never pass the bound
                state = self._read(key, entry)
                if state is None:
                    continue  # a damaged file: dropped; try the next best
            try:
                model.restore_prompt_state(entry.tokens, state)
            except LocalspecError as exc:
                log.warning("%s; dropped that state and prefilled instead", exc)
                self._drop(key, entry)
                held = 0  # the model's memory was cleared
                continue
            self._use(key)
            if source == "disk" and held_too:
                entry.state = state
                self._ram_used += entry.size
            return Restored(reused, source, perf_counter() - started)
        return None

    def keep(self, model: Model) -> None:
        """Keep the state ``model`` holds now (after a generation), unless it is kept already."""
        tokens = list(model.tokens)
        if not tokens:
            return
        identity = self._identity(model)
        key = _key(identity, tokens)
        if key in self._entries:
            self._use(key)
            return
        size = model.prompt_state_size()
        in_memory = size <= self.ram_bytes
        if not in_memory and (self.directory is None or _file_size(identity, tokens, size) > self.disk_bytes):
            return  # larger than both bounds
        if in_memory:
            self._make_room(size)  # before the copy is taken, so the states held never pass the bound
        state = model.save_prompt_state()
        entry = _Entry(identity, tokens, len(state))
        self._entries[key] = entry
        if in_memory:
            entry.state = state
            self._ram_used += entry.size
        self._write(key, entry, state)
        if entry.state is None and entry.file is None:
            del self._entries[key]  # the write failed
            return
        if model.memory_plan.memory == MemoryKind.KV:
            # A KV state cuts to any of its prefixes, so a kept state of a prefix of these tokens is no
            # longer needed (a recurrent one is restored only where it was saved: it stays).
            for other_key, other in list(self._entries.items()):
                if (other_key != key and other.identity == identity and len(other.tokens) < len(tokens)
                        and tokens[: len(other.tokens)] == other.tokens):
                    self._drop(other_key, other)

    def _use(self, key: str) -> None:
        self._entries.move_to_end(key)
        if self._entries[key].file is not None:
            _touch(self._entries[key].file)

    # -- memory --------------------------------------------------------------------------------------
    def _make_room(self, size: int) -> None:
        """Drop the least recently used states from memory until ``size`` more bytes fit the bound."""
        for key, entry in list(self._entries.items()):
            if self._ram_used + size <= self.ram_bytes:
                break
            if entry.state is not None:
                self._release(entry)
                if entry.file is None:
                    del self._entries[key]

    def _release(self, entry: _Entry) -> None:
        entry.state = None
        self._ram_used -= entry.size

    def _drop(self, key: str, entry: _Entry) -> None:
        if entry.state is not None:
            self._release(entry)
        if entry.file is not None:
            entry.file.unlink(missing_ok=True)
        del self._entries[key]

    # -- disk ------------------------------------------------------------------------------------------
    def _write(self, key: str, entry: _Entry, state: bytearray) -> None:
        """Write the state to disk if it fits the bound, deleting the least recently used files first."""
        if self.directory is None:
            return
        identity = entry.identity.encode()
        tokens = np.asarray(entry.tokens, dtype="<i4").tobytes()
        size = _file_size(entry.identity, entry.tokens, len(state))
        if size > self.disk_bytes:
            return
        path = self.directory / f"{key}{SUFFIX}"
        try:
            self.directory.mkdir(mode=_PRIVATE_DIR, parents=True, exist_ok=True)
            used, full = 0, False
            for name, file_size, _ in sorted(self._files(), key=lambda f: f[2], reverse=True):  # newest first
                if name == path.name:
                    continue  # replaced below
                full = full or used + file_size + size > self.disk_bytes
                if full:
                    self._forget_file(self.directory / name)
                else:
                    used += file_size
            crc = zlib.crc32(state, zlib.crc32(tokens, zlib.crc32(identity)))
            with temp_beside(path) as (tmp, out):  # mkstemp creates it 0600
                out.write(_HEADER.pack(_MAGIC, len(identity), len(entry.tokens), len(state), crc))
                out.write(identity)
                out.write(tokens)
                out.write(state)
                out.close()
                os.replace(tmp, path)
        except OSError as exc:  # a full or read-only disk costs the restart's reuse, not the answer
            log.warning("could not write the prompt cache file %s: %s", path, exc)
            return
        entry.file = path

    def _files(self) -> list[tuple[str, int, int]]:
        """(name, bytes, mtime) of the state files on disk, whatever model wrote them."""
        if self.directory is None:
            return []
        found = []
        try:
            listing = list(os.scandir(self.directory))
        except OSError:
            return []
        for item in listing:
            try:
                if not item.is_file(follow_symlinks=False):
                    continue  # a symlink is never followed out of the directory
                stat = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if item.name.endswith(SUFFIX) and not item.name.startswith("."):
                found.append((item.name, stat.st_size, stat.st_mtime_ns))
            elif item.name.endswith(".part") and time.time() - stat.st_mtime > _STALE_PART_S:
                Path(item.path).unlink(missing_ok=True)  # a write a killed process left behind
        return found

    def _forget_file(self, path: Path) -> None:
        path.unlink(missing_ok=True)
        key = path.name.removesuffix(SUFFIX)
        entry = self._entries.get(key)
        if entry is not None:
            entry.file = None
            if entry.state is None:
                del self._entries[key]

    def _index(self, identity: str) -> None:
        """Add this identity's files on disk to the entries (oldest first); delete damaged ones."""
        self._indexed.add(identity)
        for name, _, _ in sorted(self._files(), key=lambda f: f[2]):
            key = name.removesuffix(SUFFIX)
            if key in self._entries:
                continue
            path = self.directory / name
            head = _read_head(path)
            if head is None:
                log.warning("deleted a damaged prompt cache file: %s", path)
                path.unlink(missing_ok=True)
            elif head[0] == identity and _key(identity, head[1]) == key:
                self._entries[key] = _Entry(identity, head[1], head[2], file=path)
                self._entries.move_to_end(key)

    def _read(self, key: str, entry: _Entry) -> bytearray | None:
        """The state of a file, checked whole; a damaged file is deleted and its entry dropped."""
        path = entry.file
        state = _read_state(path, entry) if path is not None else None
        if state is None:
            log.warning("ignored and deleted a damaged prompt cache file: %s", path)
            self._drop(key, entry)
        return state

    def _identity(self, model: Model) -> str:
        identity = self._identities.get(model)
        if identity is None:
            identity = self._identities[model] = model.state_identity()
        if self.directory is not None and identity not in self._indexed:
            self._index(identity)
        return identity


def usable_prefix(held: Sequence[int], prompt: Sequence[int], *, exact: bool) -> int:
    """How many leading ``prompt`` tokens a state holding ``held`` saves from the prefill.

    At least the prompt's last token is evaluated (its logits give the first answer token). An ``exact``
    (recurrent) state counts only when it holds a prefix of the prompt: it cannot be cut back.
    """
    limit = len(prompt) - 1
    common = common_prefix_length(held, prompt)
    if exact:
        return len(held) if common == len(held) <= limit else 0
    return min(common, limit)


def _file_size(identity: str, tokens: Sequence[int], state_size: int) -> int:
    return _HEADER.size + len(identity.encode()) + 4 * len(tokens) + state_size


def _key(identity: str, tokens: Sequence[int]) -> str:
    digest = hashlib.sha256(identity.encode())
    digest.update(np.asarray(tokens, dtype="<i4").tobytes())
    return digest.hexdigest()[:40]


def _touch(path: Path) -> None:
    try:
        os.utime(path)  # the disk's eviction order is the files' age
    except OSError:
        pass


def _head(f) -> tuple | None:
    """A state file's header fields (magic, identity, token and state sizes, checksum); None if cut short."""
    head = f.read(_HEADER.size)
    return _HEADER.unpack(head) if len(head) == _HEADER.size else None


def _read_head(path: Path) -> tuple[str, list[int], int] | None:
    """(identity, tokens, state bytes) of a state file whose sizes add up; None for a damaged one."""
    try:
        with path.open("rb") as f:
            if (head := _head(f)) is None:
                return None
            magic, n_identity, n_tokens, n_state, _ = head
            size = os.fstat(f.fileno()).st_size
            if magic != _MAGIC or size != _HEADER.size + n_identity + 4 * n_tokens + n_state:
                return None
            identity = f.read(n_identity).decode()
            tokens = np.frombuffer(f.read(4 * n_tokens), dtype="<i4").tolist()
    except (OSError, UnicodeDecodeError):
        return None
    return identity, tokens, n_state


def _read_state(path: Path, entry: _Entry) -> bytearray | None:
    """The state stored in ``path`` if the file still holds ``entry`` and its checksum holds, else None."""
    identity = entry.identity.encode()
    tokens = np.asarray(entry.tokens, dtype="<i4").tobytes()
    try:
        with path.open("rb") as f:
            if (head := _head(f)) is None:
                return None
            magic, n_identity, n_tokens, n_state, crc = head
            if (magic, n_identity, n_tokens, n_state) != (_MAGIC, len(identity), len(entry.tokens), entry.size):
                return None
            if f.read(len(identity)) != identity or f.read(len(tokens)) != tokens:
                return None
            state = bytearray(n_state)
            view = memoryview(state)
            done = 0
            while done < n_state:
                read = f.readinto(view[done : done + _READ_CHUNK])
                if not read:
                    return None
                done += read
            if f.read(1):
                return None
    except OSError:
        return None
    if zlib.crc32(state, zlib.crc32(tokens, zlib.crc32(identity))) != crc:
        return None
    return state

