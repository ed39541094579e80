"""The `speclm` command line: generate (--json, streaming, --stop, empty prompt), chat over piped stdin, --help."""

from __future__ import annotations

import io
import json

import pytest

from speclm.cli import COMMANDS, build_parser, main
from speclm.sampling_params import SamplingParams
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

STORIES = ["--model", STORIES_MODEL, "--tokenizer", STORIES_TOKENIZER]


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def generate_json(capsys, *argv: str) -> dict:
    code, out, err = run_cli(capsys, "generate", "--json", *STORIES, *argv)
    assert code == 0, err
    return json.loads(out)


def test_generate_json_schema(capsys):
    result = generate_json(capsys, "--prompt", "Once upon a time", "--max-tokens", "12")
    assert set(result) >= {"text", "token_ids", "finish_reason", "stats"}
    assert isinstance(result["text"], str) and result["text"]
    assert len(result["token_ids"]) == 12 and all(isinstance(t, int) for t in result["token_ids"])
    assert result["finish_reason"] == "length"
    stats = result["stats"]
    assert stats["prompt_tokens"] == 5  # BOS + 4 tokens
    assert stats["completion_tokens"] == 12
    assert stats["seconds"] > 0
    assert stats["tokens_per_s"] == pytest.approx(12 / stats["seconds"])


def test_generate_empty_prompt_starts_from_bos(capsys):
    result = generate_json(capsys, "--prompt", "", "--max-tokens", "30")
    assert result["text"].startswith("Once upon a time, there was a little girl named Lily.")
    assert result["token_ids"][:6] == [403, 407, 261, 378, 432, 383]
    assert result["stats"]["prompt_tokens"] == 1


def test_generate_stop_truncates_text(capsys):
    result = generate_json(capsys, "--prompt", "", "--max-tokens", "40", "--stop", "Lily")
    assert result["text"] == "Once upon a time, there was a little girl named "
    assert result["finish_reason"] == "stop"
    two = generate_json(capsys, "--prompt", "", "--max-tokens", "40", "--stop", "Lily", "--stop", "girl")
    assert two["text"] == "Once upon a time, there was a little "  # the earliest stop string wins


def test_streamed_text_equals_json_text(capsys):
    argv = ["--prompt", "The dog", "--max-tokens", "40"]
    code, streamed, err = run_cli(capsys, "generate", *STORIES, *argv)
    assert code == 0
    assert streamed == generate_json(capsys, *argv)["text"] + "\n"
    assert "tokens/s" in err  # the statistics line goes to stderr, not into the text


def test_generate_reads_prompt_from_stdin(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert generate_json(capsys, "--max-tokens", "8")["token_ids"] == [403, 407, 261, 378, 432, 383, 286, 261]


def test_chat_answers_piped_stdin(default_llm, capsys, monkeypatch):
    """Two turns over a pipe: each answer equals LLM.chat on the same history (the CLI adds nothing)."""
    monkeypatch.setattr("speclm.cli.chat.load_llm", lambda args: default_llm)  # reuse the loaded model
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the capital of France?\n\n/reset\nSay hi.\n/exit\nignored\n"))
    code, out, err = run_cli(capsys, "chat", "--max-tokens", "8", "--system", "Answer in one short sentence.")
    assert code == 0, err
    params = SamplingParams(max_tokens=8)
    system = {"role": "system", "content": "Answer in one short sentence."}
    first = default_llm.chat([system, {"role": "user", "content": "What is the capital of France?"}], params)
    second = default_llm.chat([system, {"role": "user", "content": "Say hi."}], params)  # /reset dropped turn 1
    assert "Paris" in first.text
    assert out == first.text + "\n" + second.text + "\n"


# What each subcommand's --help must mention: its model option, or what it takes instead.
HELP_MUST_MENTION = {"eval": "ppl", "merge": "--config", "export": "gguf"}


@pytest.mark.parametrize("command", [m.__name__.rsplit(".", 1)[-1] for m in COMMANDS])
def test_help_for_each_subcommand(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: speclm {command}")
    assert HELP_MUST_MENTION.get(command, "--model") in out


def test_eval_ppl_help_explains_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "ppl", "--help"])
    out = capsys.readouterr().out
    assert "--model" in out and "--text" in out and "--seq-len" in out


def test_export_gguf_help_explains_its_options(capsys):
    with pytest.raises(SystemExit):
        main(["export", "gguf", "--help"])
    out = capsys.readouterr().out
    assert "--model" in out and "--out" in out and "f16" in out and "q8_0" in out and "llama.cpp" in out


def test_top_level_help_lists_commands(capsys):
    code = main([])
    assert code == 2
    out = capsys.readouterr().out
    for command in build_parser()._subparsers._group_actions[0].choices:
        assert command in out


def test_generate_compare_ar_prints_both_speeds_and_the_same_text(capsys):
    argv = ["--prompt", "Tom had a red ball. Tom had a red ball. Tom", "--max-tokens", "24", "--spec", "ngram"]
    code, out, err = run_cli(capsys, "generate", *STORIES, *argv, "--compare-ar")
    assert code == 0, err
    assert "plain decoding" in err and "x faster" in err and "the same text, token for token" in err
    assert out == run_cli(capsys, "generate", *STORIES, *argv)[1]  # the speculative run's text, streamed
    code, _, err = run_cli(capsys, "generate", *STORIES, "--prompt", "x", "--compare-ar")  # no --spec
    assert code != 0 and "--compare-ar" in err


def test_generate_structured_output_options(capsys, tmp_path):
    result = generate_json(capsys, "--prompt", "Once", "--choice", "upon a time", "--choice", "there was")
    assert result["text"] in ("upon a time", "there was") and result["finish_reason"] == "stop"
    schema = {"type": "object", "properties": {"age": {"type": "integer"}}, "required": ["age"]}
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    result = generate_json(capsys, "--prompt", "Once", "--json-schema", str(path), "--max-tokens", "40")
    if result["finish_reason"] == "stop":
        assert isinstance(json.loads(result["text"])["age"], int)
    code, _, err = run_cli(capsys, "generate", *STORIES, "--prompt", "x", "--regex", "(unclosed")
    assert code != 0 and "--regex" in err
