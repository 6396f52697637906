"""Fuzzing the header reader: mutated generated (and, with -m real, real) headers and random bytes.

Only ``GGUFError`` may come out, never another exception, a hang or a large allocation. The number of
examples per test is LOCALSPEC_FUZZ_EXAMPLES (default sized for about 20-30 s of CI in all).
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from localspec.errors import GGUFError
from localspec.gguf.header import read_header, read_header_prefix
from tests.test_compat import smollm2_path  # noqa: F401  (fixture)

EXAMPLES = int(os.environ.get("LOCALSPEC_FUZZ_EXAMPLES", "6000"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
# Values that break naive readers: zero, sign bits, overflow edges, sizes just past any real file.
EDGE_UINT64 = [0, 1, 7, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1]


def parse_only_cleanly(data: bytes, tmp_file: Path, outcomes: Counter) -> None:
    """Read ``data`` both ways; count in ``outcomes`` whether each read refused it or parsed it."""
    try:
        read_header_prefix(data)
        outcomes["parsed"] += 1
    except GGUFError:
        outcomes["refused"] += 1
    tmp_file.write_bytes(data)
    try:
        read_header(tmp_file)
        outcomes["parsed"] += 1
    except GGUFError:
        outcomes["refused"] += 1


# One mutation: (kind, where as a fraction of the length, a value); drawn as small tuples so that a
# failing example prints short, then applied to the seed by ``mutate``.
MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["byte", "uint64", "uint32", "cut", "splice"]),
        st.floats(0, 1),
        st.one_of(st.integers(0, 255), st.sampled_from(EDGE_UINT64), st.integers(0, 2**32 - 1)),
    ),
    min_size=1,
    max_size=4,
)


def mutate(seed: bytes, mutations: list[tuple[str, float, int]]) -> bytes:
    """``seed`` with byte flips, uint64/uint32 overwrites with edge values, cuts, or spliced copies."""
    data = bytearray(seed)
    for kind, where, value in mutations:
        at = int(where * max(0, len(data) - 1))
        if kind == "byte" and data:
            data[at] = value & 0xFF
        elif kind == "uint64":
            data[at : at + 8] = struct.pack("<Q", value)
        elif kind == "uint32":
            data[at : at + 4] = struct.pack("<I", value & 0xFFFFFFFF)
        elif kind == "cut":
            del data[at:]
        else:
            data[at:at] = data[value % max(1, len(data)) :][: 1 + value % 64]
    return bytes(data)


# Mutations near the front hit the counts, keys and array headers; the tail is mostly token strings.
@pytest.fixture(scope="module")
def seed(make_tiny_model) -> bytes:
    path = make_tiny_model(
        "fuzz-seed", tokens=["<unk>", "<s>", "</s>", "a", "b", "ab"], merges=["a b"], pre_tokenizer="default",
        n_layers=1, n_embd=8, n_head=2, n_ff=8, extra={"fuzz.nested": [1, 2], "tokenizer.ggml.add_bos_token": True},
    )
    return path.read_bytes()


def test_mutated_generated_headers_fail_cleanly(seed, tmp_path):
    tmp_file = tmp_path / "fuzz.gguf"
    outcomes = Counter()

    @FUZZ
    @given(MUTATIONS)
    def run(mutations) -> None:
        parse_only_cleanly(mutate(seed, mutations), tmp_file, outcomes)

    run()
    # Mutations that break the header and ones that leave it readable were both tried: the fuzzer reached
    # the parser's checks, not only its first refusal.
    assert outcomes["refused"] > 0 and outcomes["parsed"] > 0, outcomes


def test_random_bytes_after_a_valid_preamble_fail_cleanly(tmp_path):
    tmp_file = tmp_path / "fuzz.gguf"
    preamble = st.builds(
        lambda version, n_tensors, n_kv: b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv),
        st.sampled_from([2, 3]),
        st.sampled_from(EDGE_UINT64[:4]),
        st.sampled_from(EDGE_UINT64[:4]),
    )

    outcomes = Counter()

    @FUZZ
    @given(preamble, st.binary(max_size=512))
    def run(head: bytes, body: bytes) -> None:
        parse_only_cleanly(head + body, tmp_file, outcomes)

    run()
    assert outcomes["refused"] > 0, outcomes


@pytest.mark.real
def test_mutated_real_header_fails_cleanly(smollm2_path, tmp_path):  # noqa: F811
    # The first 64 KiB of a real header: its counts, keys and the start of its 49152-token array.
    real_seed = smollm2_path.read_bytes()[: 64 * 1024]
    tmp_file = tmp_path / "fuzz.gguf"

    outcomes = Counter()

    @settings(FUZZ, max_examples=max(1, EXAMPLES // 5))
    @given(MUTATIONS)
    def run(mutations) -> None:
        parse_only_cleanly(mutate(real_seed, mutations), tmp_file, outcomes)

    run()
    assert outcomes["refused"] > 0, outcomes
