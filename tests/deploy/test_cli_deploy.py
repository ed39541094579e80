"""`speclm deploy` options: help, mistakes (one `error:` line, exit 2, before Ray starts), environment defaults."""

from __future__ import annotations

import pytest

from speclm.cli import build_parser, main
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

MODEL = ["--model", STORIES_MODEL, "--tokenizer", STORIES_TOKENIZER]


def test_help_explains_the_services(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["deploy", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in ("--draft", "--draft-replicas", "--target-replicas", "--max-draft-tokens", "--host", "--port"):
        assert option in out
    assert "coordinator" in out and "docs/deploy.md" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--draft-replicas", "0"], "draft-replicas must be >= 1"),
        (["--target-replicas", "-1"], "target-replicas must be >= 1"),
        (["--draft", STORIES_MODEL, "--max-draft-tokens", "0"], "max-draft-tokens must be in 1..32"),
        (["--draft", "missing.gguf"], "model file not found: missing.gguf"),
        (["--port", "70000"], "--port must be in 0..65535"),
        (["--draft-timeout", "0"], "draft-timeout must be > 0"),
    ],
)
def test_mistakes_print_one_error_line_and_exit_2(capsys, argv, message):
    assert main(["deploy", *MODEL, *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("speclm deploy: error:") and message in err[-1]


def test_options_and_environment_make_the_config(monkeypatch):
    from speclm.cli.deploy import deploy_config

    monkeypatch.setenv("MAX_DRAFT_TOKENS", "6")
    monkeypatch.setenv("DRAFT_ENDPOINT", "draft_node")
    monkeypatch.setenv("TARGET_ENDPOINT", "target_node")
    args = build_parser().parse_args(
        ["deploy", *MODEL, "--draft", STORIES_MODEL, "--draft-replicas", "3", "--target-replicas", "2"]
    )
    config = deploy_config(args)
    assert (config.draft_replicas, config.target_replicas, config.max_draft_tokens) == (3, 2, 6)
    assert (config.draft_endpoint, config.target_endpoint) == ("draft_node", "target_node")
    assert config.draft_spec().label == f"draft:{STORIES_MODEL}"
    assert config.server.model_name == "stories260K"
    explicit = build_parser().parse_args(["deploy", *MODEL, "--draft", STORIES_MODEL, "--max-draft-tokens", "2"])
    assert deploy_config(explicit).max_draft_tokens == 2  # the option wins over the environment
    monkeypatch.setenv("MAX_DRAFT_TOKENS", "many")
    with pytest.raises(ValueError, match="MAX_DRAFT_TOKENS"):
        deploy_config(build_parser().parse_args(["deploy", *MODEL]))
