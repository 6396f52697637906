"""A bounded, validating reader for GGUF headers: metadata key/values only, never tensor data.

Every count and length in a header is checked against the bytes that can still follow it (the file
size, or the length of a prefix fetched from a remote store) before anything is allocated, so a crafted
header that claims 2^40 entries fails at once with a one-line ``GGUFError``. ``gguf.GGUFReader`` is not
used: it memory-maps the whole file and trusts the counts.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from localspec.errors import GGUFError

# localspec never fetches or parses more header than this (a 262k-token vocabulary with merges is ~10 MB).
MAX_HEADER_BYTES = 64 * 1024 * 1024
SUPPORTED_VERSIONS = (2, 3)
# Nested arrays are legal GGUF but no real model goes deeper than one level.
MAX_ARRAY_DEPTH = 4
# ggml's GGML_MAX_DIMS.
MAX_TENSOR_DIMS = 4
DEFAULT_ALIGNMENT = 32
_READ_CHUNK = 1024 * 1024
_MAGIC = b"GGUF"

_SCALAR_FORMATS = {
    GGUFValueType.UINT8: "B",
    GGUFValueType.INT8: "b",
    GGUFValueType.UINT16: "H",
    GGUFValueType.INT16: "h",
    GGUFValueType.UINT32: "I",
    GGUFValueType.INT32: "i",
    GGUFValueType.FLOAT32: "f",
    GGUFValueType.BOOL: "?",
    GGUFValueType.UINT64: "Q",
    GGUFValueType.INT64: "q",
    GGUFValueType.FLOAT64: "d",
}
# The fewest bytes one element of each type can take: used to bound counts before looping.
_MIN_SIZES = {t: struct.calcsize("<" + f) for t, f in _SCALAR_FORMATS.items()}
_MIN_SIZES[GGUFValueType.STRING] = 8  # a uint64 length, possibly zero bytes of text
_MIN_SIZES[GGUFValueType.ARRAY] = 12  # element type + count, possibly empty
_MIN_KV_SIZE = 8 + 4 + 1  # key length + value type + the smallest value
_MIN_TENSOR_INFO_SIZE = 8 + 4 + 4 + 8  # name length + n_dims + type + offset (no dims)


class GGUFTruncatedError(GGUFError):
    """The header goes on past the bytes available: a truncated file, or a prefix that was too short."""


class _Cursor:
    """Reads GGUF fields from a file or a byte prefix, refusing to read past ``limit`` (absolute offset)."""

    def __init__(
        self, what: str, limit: int, limit_reason: str, *, complete: bool, data: bytes = b"", source: BinaryIO | None = None
    ) -> None:
        self.what = what
        self.limit = limit
        self.limit_reason = limit_reason
        # False for a prefix that may stop short of the header's end: more bytes could be fetched.
        self.complete = complete
        self.endian = "<"
        self.pos = 0
        self._source = source
        self._buf = data
        self._base = 0  # absolute offset of _buf[0]

    def remaining(self) -> int:
        return self.limit - self.pos

    def check_fits(self, n: int, claim: str) -> None:
        """Refuse a claimed size before allocating for it; a prefix that is merely short asks for more."""
        if n <= self.remaining():
            return
        if not self.complete and self.pos + n <= MAX_HEADER_BYTES:
            raise GGUFTruncatedError(f"{self.what}: header truncated: {claim}, past {self.limit_reason}")
        raise GGUFError(f"{self.what}: {claim}, past the end of the header")

    def _need(self, n: int) -> int:
        """Make ``n`` bytes at ``pos`` available; return their offset inside ``_buf``."""
        if n > self.remaining():
            raise GGUFTruncatedError(
                f"{self.what}: header truncated: byte {self.pos} needs {n} more bytes, past {self.limit_reason}"
            )
        offset = self.pos - self._base
        short = offset + n - len(self._buf)
        if short > 0 and self._source is not None:
            # Grow in chunks so a header of 300k small strings costs a few reads, not 300k.
            self._buf = self._buf[offset:] + self._source.read(max(short, _READ_CHUNK))
            self._base, offset = self.pos, 0
        if offset + n > len(self._buf):
            raise GGUFTruncatedError(f"{self.what}: header truncated at byte {self.pos}")
        return offset

    def take(self, n: int) -> bytes:
        offset = self._need(n)
        self.pos += n
        return self._buf[offset : offset + n]

    def scalars(self, fmt: str, count: int = 1) -> tuple:
        size = struct.calcsize(fmt) * count
        offset = self._need(size)
        self.pos += size
        return struct.unpack_from(f"{self.endian}{count}{fmt}", self._buf, offset)

    def scalar(self, fmt: str):
        return self.scalars(fmt)[0]

    def string(self) -> str:
        length = self.scalar("Q")
        self.check_fits(length, f"string at byte {self.pos - 8} claims {length} bytes")
        # surrogateescape keeps two different invalid byte strings different when vocabularies are compared.
        return str(self.take(length), "utf-8", "surrogateescape")

    def strings(self, count: int) -> list[str]:
        """``count`` strings in a row; the hot loop of a 150k-token vocabulary, so it works on locals."""
        unpack_length = struct.Struct(self.endian + "Q").unpack_from
        out: list[str] = []
        append = out.append
        buf, base = self._buf, self._base
        off, end = self.pos - base, min(len(buf), self.limit - base)
        for _ in range(count):
            if off + 8 > end:
                buf, base, off, end = self._refill(base + off, 8)
            (length,) = unpack_length(buf, off)
            if off + 8 + length > end:
                self.pos = base + off + 8
                self.check_fits(length, f"string at byte {base + off} claims {length} bytes")
                buf, base, off, end = self._refill(base + off, 8 + length)
            append(str(buf[off + 8 : off + 8 + length], "utf-8", "surrogateescape"))
            off += 8 + length
        self.pos = base + off
        return out

    def _refill(self, pos: int, n: int) -> tuple[bytes, int, int, int]:
        self.pos = pos
        offset = self._need(n)
        return self._buf, self._base, offset, min(len(self._buf), self.limit - self._base)


Metadata = dict[str, object]


def read_header(path: str | Path, *, check_tensors: bool = True) -> Metadata:
    """Metadata of the GGUF file at ``path``; with ``check_tensors``, also check each tensor lies inside the file.

    Raises:
        GGUFError: not a GGUF file, an unsupported version, or any count, length or type out of bounds.
    """
    path = Path(path)
    try:
        with path.open("rb") as source:
            size = os.fstat(source.fileno()).st_size
            if size > MAX_HEADER_BYTES:
                limit, reason = MAX_HEADER_BYTES, f"localspec's {MAX_HEADER_BYTES >> 20} MiB header limit"
            else:
                limit, reason = size, f"the end of the file ({size} bytes)"
            cursor = _Cursor(path.name, limit, reason, complete=True, source=source)
            return _parse(cursor, file_size=size if check_tensors else None)
    except OSError as exc:
        raise GGUFError(f"cannot read {path}: {exc.strerror or exc}") from exc


def read_header_prefix(data: bytes, *, what: str = "GGUF prefix") -> Metadata:
    """Metadata from the first bytes of a GGUF file (e.g. an HTTP range request); tensors are not checked.

    Raises:
        GGUFTruncatedError: the header goes on past ``data``; fetch more bytes (up to MAX_HEADER_BYTES).
        GGUFError: as for ``read_header``.
    """
    data = bytes(data[:MAX_HEADER_BYTES])
    cursor = _Cursor(what, len(data), f"the {len(data)} bytes fetched", complete=len(data) == MAX_HEADER_BYTES, data=data)
    return _parse(cursor, file_size=None)


def _parse(cur: _Cursor, *, file_size: int | None) -> Metadata:
    tensor_count, kv_count = _preamble(cur)
    cur.check_fits(
        kv_count * _MIN_KV_SIZE + tensor_count * _MIN_TENSOR_INFO_SIZE,
        f"header claims {tensor_count} tensors and {kv_count} keys",
    )
    metadata: Metadata = {}
    for _ in range(kv_count):
        key = cur.string()
        if key in metadata:
            raise GGUFError(f"{cur.what}: key {key!r} appears twice")
        metadata[key] = _value(cur, _value_type(cur), depth=0)
    if file_size is not None:
        _check_tensors(cur, tensor_count, metadata, file_size)
    return metadata


def _preamble(cur: _Cursor) -> tuple[int, int]:
    """Magic, version and the two counts; picks the byte order (big-endian GGUF files exist)."""
    if cur.take(4) != _MAGIC:
        raise GGUFError(f"{cur.what}: not a GGUF file (bad magic)")
    version = cur.scalar("I")
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped not in SUPPORTED_VERSIONS:
            raise GGUFError(f"{cur.what}: GGUF version {version} is not supported (only {SUPPORTED_VERSIONS})")
        cur.endian = ">"
    tensor_count, kv_count = cur.scalars("Q", 2)
    return tensor_count, kv_count


def _value_type(cur: _Cursor) -> GGUFValueType:
    raw = cur.scalar("I")
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise GGUFError(f"{cur.what}: unknown value type {raw} at byte {cur.pos - 4}") from None


def _value(cur: _Cursor, vtype: GGUFValueType, depth: int) -> object:
    if vtype == GGUFValueType.STRING:
        return cur.string()
    if vtype != GGUFValueType.ARRAY:
        return cur.scalar(_SCALAR_FORMATS[vtype])
    if depth >= MAX_ARRAY_DEPTH:
        raise GGUFError(f"{cur.what}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels")
    etype = _value_type(cur)
    count = cur.scalar("Q")
    cur.check_fits(count * _MIN_SIZES[etype], f"array at byte {cur.pos - 12} claims {count} entries")
    if etype == GGUFValueType.STRING:
        return cur.strings(count)
    if etype != GGUFValueType.ARRAY:
        return list(cur.scalars(_SCALAR_FORMATS[etype], count))
    return [_value(cur, etype, depth + 1) for _ in range(count)]


def _check_tensors(cur: _Cursor, tensor_count: int, metadata: Metadata, file_size: int) -> None:
    """Each tensor's dims and type are sane and its data lies inside the file (llama.cpp trusts less after us)."""
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise GGUFError(f"{cur.what}: general.alignment {alignment!r} is not a power of two")
    extents = []
    for _ in range(tensor_count):
        name = cur.string()
        n_dims = cur.scalar("I")
        if n_dims > MAX_TENSOR_DIMS:
            raise GGUFError(f"{cur.what}: tensor {name!r} has {n_dims} dimensions (at most {MAX_TENSOR_DIMS})")
        dims = cur.scalars("Q", n_dims)
        raw_type, offset = cur.scalar("I"), cur.scalar("Q")
        try:
            block_size, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            raise GGUFError(f"{cur.what}: tensor {name!r} has unknown type {raw_type}") from None
        n_elements = 1
        for dim in dims:
            n_elements *= dim
        if n_elements % block_size or offset % alignment:
            raise GGUFError(f"{cur.what}: tensor {name!r} is misaligned or not a whole number of blocks")
        extents.append((name, offset, n_elements // block_size * type_size))
    data_start = -(-cur.pos // alignment) * alignment
    for name, offset, nbytes in extents:
        if data_start + offset + nbytes > file_size:
            raise GGUFError(f"{cur.what}: tensor {name!r} ends past the end of the file (truncated download?)")
