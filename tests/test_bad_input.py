"""Bad input gets one clear error line naming the problem (exit code 2), never a traceback."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from speclm.cli import main
from speclm.models.checkpoint import ModelLoadError
from speclm.models.loader import default_model_path, load_checkpoint
from speclm.sampling_params import SamplingParams
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

STORIES = ["--model", STORIES_MODEL, "--tokenizer", STORIES_TOKENIZER]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_one_error_line(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    # Progress lines of the load ("speclm: loading ...") may come first; the failure itself is one line.
    lines = [line for line in err.strip().splitlines() if not line.startswith("speclm: ")]
    assert len(lines) == 1 and lines[0].startswith("speclm generate: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    source = default_model_path()
    files = {
        # header and metadata intact, tensor data cut short
        "truncated_data": (d / "truncated-data.gguf", lambda f: f.write(open(source, "rb").read(3_000_000))),
        # cut inside the metadata (the vocabulary)
        "truncated_meta": (d / "truncated-meta.gguf", lambda f: f.write(open(source, "rb").read(200_000))),
        "garbage": (d / "garbage.gguf", lambda f: f.write(b"GGUF" + bytes(range(256)) * 4)),
        "empty_gguf": (d / "empty.gguf", lambda f: None),
        "short_bin": (d / "short.bin", lambda f: f.write(b"\x01\x02")),
    }
    for path, write in files.values():
        with open(path, "wb") as f:
            write(f)
    gpt2 = d / "gpt2.gguf"
    import gguf

    writer = gguf.GGUFWriter(str(gpt2), "gpt2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    hf_gpt2 = d / "gpt2-hf"
    hf_gpt2.mkdir()
    (hf_gpt2 / "config.json").write_text(
        json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 100, "n_embd": 32})
    )
    return {**{k: str(p) for k, (p, _) in files.items()}, "gpt2_gguf": str(gpt2), "gpt2_hf": str(hf_gpt2)}


@pytest.mark.parametrize(
    "case, fragments",
    [
        ("missing", ["model file not found", "/no/such/model.gguf"]),
        ("truncated_data", ["truncated-data.gguf", "truncated or corrupt"]),
        ("truncated_meta", ["truncated-meta.gguf", "truncated or corrupt"]),
        ("garbage", ["garbage.gguf", "truncated or corrupt"]),
        ("empty_gguf", ["empty.gguf", "not a GGUF file"]),
        ("short_bin", ["short.bin", "too short to be a llama2.c checkpoint"]),
        ("gpt2_gguf", ["unsupported GGUF architecture 'gpt2'", "llama, qwen2, qwen3, gemma3, phi3"]),
        ("gpt2_hf", ["unsupported architecture", "GPT2LMHeadModel", "Phi3ForCausalLM"]),
    ],
)
def test_bad_model_files(case, fragments, bad_files, capsys):
    path = "/no/such/model.gguf" if case == "missing" else bad_files[case]
    code, out, err = run_cli(capsys, "generate", "--prompt", "hi", "--model", path, "--tokenizer", STORIES_TOKENIZER)
    assert_one_error_line(code, err, *fragments)
    assert out == ""
    with pytest.raises(ModelLoadError):  # the Python API raises the same ValueError subclass
        load_checkpoint(path)


@pytest.mark.parametrize(
    "option, value, fragment",
    [
        ("--temperature", "-0.5", "temperature must be a finite number >= 0, got -0.5"),
        ("--top-p", "0", "top_p must be in (0, 1] (and above 0 in float32), got 0.0"),
        ("--top-p", "1.5", "top_p must be in (0, 1] (and above 0 in float32), got 1.5"),
        ("--max-tokens", "0", "max_tokens must be an integer >= 1, got 0"),
        ("--top-k", "-1", "top_k must be a non-negative integer (0 disables it), got -1"),
        ("--threads", "0", "threads must be a positive integer, got 0"),
        ("--spec", "bogus", "unknown speculative method 'bogus'"),
    ],
)
def test_bad_sampling_and_engine_options(option, value, fragment, capsys):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", *STORIES, option, value)
    assert_one_error_line(code, err, fragment)


def test_sampling_params_api_rejects_bad_values():
    for bad in (
        {"temperature": -1.0},
        {"temperature": float("nan")},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"top_k": -1},
        {"stop": [""]},
        {"seed": 1.5},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)


def test_prompt_longer_than_context(capsys):
    prompt = "the cat sat on the mat. " * 150  # far more than stories260K's 512-token context
    code, _, err = run_cli(capsys, "generate", "--prompt", prompt, *STORIES)
    assert_one_error_line(code, err, "prompt is", "the model's context is 512 tokens")


def test_llama2c_model_without_tokenizer(tmp_path, capsys):
    model = tmp_path / "model.bin"  # no tokenizer.bin beside it
    shutil.copy(STORIES_MODEL, model)
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--model", str(model))
    assert_one_error_line(code, err, "needs --tokenizer")


def test_missing_tokenizer_file(capsys):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--model", STORIES_MODEL, "--tokenizer", "/no/tok.bin")
    assert_one_error_line(code, err, "tokenizer file not found: /no/tok.bin")


def test_chat_on_a_model_without_template(capsys):
    code, _, err = run_cli(capsys, "generate", "--chat", "--prompt", "hi", *STORIES)
    assert_one_error_line(code, err, "no chat template")


def test_hub_id_without_network_fails_fast_and_clearly(monkeypatch, capsys):
    """A hub id is tried on the hub; offline that must become one clear message, not a hang."""
    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    calls = []

    def offline_snapshot_download(repo_id, **kwargs):
        calls.append(repo_id)
        raise LocalEntryNotFoundError("Cannot reach the Hub: Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline_snapshot_download)
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--model", "someorg/some-model")
    assert calls == ["someorg/some-model"]
    assert_one_error_line(
        code,
        err,
        "'someorg/some-model' is not a local file or directory",
        "Hugging Face hub failed",
        "Without a network, pass a local path",
    )


def test_cli_subprocess_bad_value_exits_2_without_traceback():
    result = subprocess.run(
        [sys.executable, "-m", "speclm", "generate", "--prompt", "hi", *STORIES, "--temperature", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.join(os.path.dirname(__file__), ".."),
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip() == "speclm generate: error: temperature must be a finite number >= 0, got -1.0"
