"""``localspec check``: exit 0 compatible, 1 incompatible (reason first), 2 for bad or unreachable input."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from localspec.cli.app import app
from localspec.errors import StoreError
from localspec.store import cache as store
from tests.tiny_models import CHAT_TEMPLATE


@pytest.fixture
def check():
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(app, ["check", *map(str, args)])

    return run


def test_a_compatible_pair_exits_0_with_a_table(check, tiny_target, tiny_draft):
    result = check(tiny_target, tiny_draft)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "compatible"
    assert "round-trip" in result.stdout and "│ ok " in result.stdout and "warning" not in result.stdout


def test_json_output(check, tiny_target, make_tiny_model):
    draft = make_tiny_model("cli-no-template", chat_template=None)
    result = check(tiny_target, draft, "--json")
    assert result.exit_code == 0
    report = json.loads(result.stdout)
    assert report["verdict"] == "compatible with warnings"
    assert {"code": "chat-template", "severity": "warning", "title": "The draft has no chat template"}.items() <= next(
        f for f in report["findings"] if f["code"] == "chat-template"
    ).items()


def test_an_incompatible_pair_exits_1_with_the_reason_first(check, tiny_target, make_tiny_model):
    result = check(tiny_target, make_tiny_model("cli-gpt2", tokenizer_model="gpt2"))
    assert result.exit_code == 1
    assert result.stdout.splitlines()[0].startswith("incompatible: Tokenizer models differ: target llama")


def test_a_sandbox_escape_template_is_flagged_and_runs_nothing(check, tiny_target, make_tiny_model, tmp_path):
    marker = tmp_path / "pwned"
    payload = "{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}" + CHAT_TEMPLATE
    result = check(tiny_target, make_tiny_model("cli-evil", chat_template=payload), "--json")
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["verdict"] == "incompatible"
    assert report["first_reason"].startswith("The draft chat template reaches outside the sandbox")
    assert not marker.exists()


@pytest.mark.parametrize("damage", ["not-gguf", "truncated", "missing"])
def test_bad_files_exit_2_with_one_line(check, tiny_target, tmp_path, damage):
    bad = tmp_path / "bad.gguf"
    if damage == "not-gguf":
        bad.write_text("hello, I am not a model\n")
    elif damage == "truncated":
        bad.write_bytes(tiny_target.read_bytes()[:-4096])
    result = check(tiny_target, bad)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output
    assert len(result.stderr.replace("\n", " ").split("error: ")) == 2


@pytest.mark.parametrize(
    "args",
    [(), ("only-one.gguf",), ("a.gguf", "b.gguf", "--profile", "qwen-coder-1.5b"), ("--profile", "no-such-profile")],
    ids=["nothing", "one", "both", "unknown-profile"],
)
def test_usage_errors_exit_2(check, args):
    result = check(*args)
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def _serve_headers(monkeypatch, files: dict[str, bytes], seen: list) -> None:
    """Stand in for the store's remote header reads (Hub range request or mirror chunk)."""

    def header_prefix(spec, max_bytes, *, offline=False):
        seen.append((spec.file, max_bytes))
        return files[spec.file][:max_bytes]

    monkeypatch.setattr(store, "header_prefix", header_prefix)


def test_hf_references_are_checked_from_header_prefixes(check, monkeypatch, tiny_target, tiny_draft):
    seen: list = []
    _serve_headers(monkeypatch, {"t.gguf": tiny_target.read_bytes(), "d.gguf": tiny_draft.read_bytes()}, seen)
    result = check("hf://org/target/t.gguf", "hf://org/draft/d.gguf", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["verdict"] == "compatible"
    assert next(f for f in report["findings"] if f["code"] == "round-trip")["detail"] == "headers only (no local files)"
    assert [file for file, _ in seen] == ["t.gguf", "d.gguf"]


def test_a_profile_is_checked_without_downloading_weights(check, monkeypatch, tiny_target):
    from localspec.profiles import load_profile

    profile = load_profile("qwen-coder-1.5b")
    seen: list = []
    _serve_headers(monkeypatch, {profile.target.file: tiny_target.read_bytes(), profile.draft.file: tiny_target.read_bytes()}, seen)
    result = check("--profile", "qwen-coder-1.5b")
    assert result.exit_code == 0, result.output
    assert len(seen) == 2


def test_an_unreachable_reference_exits_2(check, monkeypatch, tiny_target):
    def unreachable(spec, max_bytes, *, offline=False):
        raise StoreError(f"cannot read the header of {spec.label}: Hugging Face: Name or service not known")

    monkeypatch.setattr(store, "header_prefix", unreachable)
    result = check(tiny_target, "hf://org/name/file.gguf")
    assert result.exit_code == 2
    assert "cannot read the header of org/name/file.gguf" in result.stderr


def test_help_works(check):
    result = CliRunner().invoke(app, ["check", "--help"])
    assert result.exit_code == 0 and "--profile" in result.stdout


@pytest.mark.real
def test_real_qwen_pair_from_local_files(check, qwen_pair):
    result = check(*qwen_pair)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[0] == "compatible with warnings"
