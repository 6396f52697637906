"""The bounded GGUF header reader: agrees with gguf's own reader, and refuses crafted or broken headers."""

from __future__ import annotations

import struct
import tracemalloc

import gguf
import pytest

from localspec.errors import GGUFError
from localspec.gguf.header import MAX_HEADER_BYTES, GGUFTruncatedError, read_header, read_header_prefix

MERGES = ["▁ t", "h e", "▁t he"]
STRING, ARRAY, UINT32 = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32


def gguf_string(text: str, endian: str = "<") -> bytes:
    raw = text.encode()
    return struct.pack(endian + "Q", len(raw)) + raw


def crafted(kvs: list[bytes], *, n_tensors: int = 0, n_kv: int | None = None, version: int = 3, endian: str = "<") -> bytes:
    """A header with these raw key/value records (and no tensor infos unless the test adds them)."""
    count = len(kvs) if n_kv is None else n_kv
    return b"GGUF" + struct.pack(endian + "IQQ", version, n_tensors, count) + b"".join(kvs)


def kv_uint32(key: str, value: int, endian: str = "<") -> bytes:
    return gguf_string(key, endian) + struct.pack(endian + "II", UINT32, value)


def kv_array_head(key: str, element_type: int, count: int) -> bytes:
    """A key and an array header claiming ``count`` entries, with no entries following."""
    return gguf_string(key) + struct.pack("<IIQ", ARRAY, element_type, count)


@pytest.fixture(scope="module")
def tiny(make_tiny_model):
    return make_tiny_model("header-tiny", merges=MERGES, pre_tokenizer="default", extra={"tokenizer.ggml.add_bos_token": True})


def test_reads_what_gguf_wrote(tiny):
    header = read_header(tiny)
    reference = gguf.GGUFReader(str(tiny))
    assert set(header) == set(reference.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    assert header["tokenizer.ggml.tokens"] == [str(bytes(p), "utf-8") for p in _parts(reference, "tokenizer.ggml.tokens")]
    assert header["tokenizer.ggml.merges"] == MERGES
    assert header["tokenizer.ggml.pre"] == "default"
    assert header["tokenizer.ggml.add_bos_token"] is True
    assert header["tokenizer.ggml.bos_token_id"] == 1
    assert header["tokenizer.ggml.token_type"][:3] == [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    assert header["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-5)


def _parts(reader: gguf.GGUFReader, key: str) -> list:
    field = reader.fields[key]
    return [field.parts[i] for i in field.data]


def test_a_prefix_gives_the_same_metadata(tiny):
    assert read_header_prefix(tiny.read_bytes()[:200_000]) == read_header(tiny)


def test_a_short_prefix_asks_for_more_bytes(tiny):
    with pytest.raises(GGUFTruncatedError, match="header truncated.*the 2000 bytes fetched"):
        read_header_prefix(tiny.read_bytes()[:2000])


def test_truncated_tensor_data_is_caught_before_llama_cpp_sees_it(tiny, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:-1000])
    with pytest.raises(GGUFError, match="ends past the end of the file"):
        read_header(cut)
    assert read_header(cut, check_tensors=False)["general.architecture"] == "llama"


def test_a_file_cut_inside_the_metadata(tiny, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(tiny.read_bytes()[:3000])
    with pytest.raises(GGUFTruncatedError, match="the end of the file"):
        read_header(cut)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "header truncated"),
        (b"PK\x03\x04" + bytes(40), "not a GGUF file"),
        (crafted([], version=1), "version 1 is not supported"),
        (crafted([], version=4), "version 4 is not supported"),
        (crafted([], n_kv=2**40), "claims 0 tensors and 1099511627776 keys"),
        (crafted([], n_tensors=2**63), "tensors"),
        (crafted([gguf_string("a") + struct.pack("<I", 99)]), "unknown value type 99"),
        (crafted([gguf_string("a") + struct.pack("<IQ", STRING, 2**62)]), "claims 4611686018427387904 bytes"),
        (crafted([struct.pack("<Q", 2**64 - 1)]), "claims"),
        (crafted([kv_uint32("a", 1), kv_uint32("a", 2)]), "key 'a' appears twice"),
        (crafted([gguf_string("deep") + struct.pack("<I", ARRAY) + struct.pack("<IQ", ARRAY, 1) * 6]), "nested deeper"),
    ],
    ids=["empty", "zip", "v1", "v4", "kv-count", "tensor-count", "value-type", "string-length", "key-length", "duplicate", "nesting"],
)
def test_crafted_headers_fail_with_one_line(data, message):
    with pytest.raises(GGUFError, match=message) as caught:
        read_header_prefix(data)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("element_type", [STRING, UINT32, ARRAY])
def test_2_pow_40_array_entries_fail_at_once_in_little_memory(element_type, tmp_path):
    path = tmp_path / "huge.gguf"
    path.write_bytes(crafted([kv_uint32("general.alignment", 32), kv_array_head("tokenizer.ggml.tokens", element_type, 2**40)]))
    tracemalloc.start()
    with pytest.raises(GGUFError, match="claims 1099511627776 entries"):
        read_header(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    # The reader's first read is one 1 MiB chunk at most; nothing is sized from the claimed count (nor
    # iterated over it: a loop over 2^40 entries would never end, and the test timeout would fail it).
    assert peak < 4 * 1024 * 1024


def test_a_prefix_larger_than_the_cap_is_not_parsed_past_it():
    # A string that would end after MAX_HEADER_BYTES is refused even though the bytes are there.
    length = MAX_HEADER_BYTES
    data = crafted([gguf_string("a") + struct.pack("<IQ", STRING, length)]) + bytes(length)
    with pytest.raises(GGUFError, match="past the end of the header"):
        read_header_prefix(data)


def test_big_endian_files_are_read():
    header = read_header_prefix(crafted([kv_uint32("general.alignment", 64, ">")], endian=">"))
    assert header == {"general.alignment": 64}


def test_a_missing_file_is_a_gguf_error(tmp_path):
    with pytest.raises(GGUFError, match="cannot read"):
        read_header(tmp_path / "nope.gguf")


@pytest.mark.real
def test_qwen_pair_headers_are_read_whole(qwen_pair):
    for header in (read_header(path) for path in qwen_pair):
        assert len(header["tokenizer.ggml.tokens"]) == 151936
        assert len(header["tokenizer.ggml.merges"]) > 150_000
