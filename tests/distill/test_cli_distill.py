"""`speclm distill` from the command line: a tiny end-to-end run and one-line errors for bad input."""

import json

import pytest

from speclm.cli import main
from speclm.speculative.heads import load_head
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER


@pytest.mark.usefixtures("one_thread")
def test_distill_cli_trains_and_saves_medusa_heads(tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    rows = [
        {"question_id": i, "category": "story", "turns": [f"Once upon a time there was a {w}"]}
        for i, w in enumerate("cat dog bird fish girl boy king queen tree car ship lamp".split())
    ]
    prompts.write_text("\n".join(json.dumps(r) for r in rows))  # 12 rows: the last 2 are trainable
    out = tmp_path / "medusa"
    rc = main(
        [
            "distill",
            "--model",
            STORIES_MODEL,
            "--tokenizer",
            STORIES_TOKENIZER,
            "--weights",
            "fp32",
            "--student",
            "medusa",
            "--medusa-heads",
            "2",
            "--out",
            str(out),
            "--prompts",
            str(prompts),
            "--no-own-prompts",
            "--no-chat",
            "--max-new-tokens",
            "12",
            "--data-dir",
            str(tmp_path / "data"),
            "--steps",
            "3",
            "--lr",
            "1e-3",
            "--seed",
            "1",
        ]
    )
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["sequences"] == 2 and summary["steps"] == 3
    head = load_head(out)
    assert head.num_heads == 2 and head.token_map is None


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--student", "draft", "--alpha", "1.5"], "--alpha must be in [0, 1]"),
        (["--student", "draft", "--temperature", "0"], "--temperature must be positive"),
        (["--student", "eagle", "--init-only"], "--init-only"),
        (["--student", "draft", "--steps", "0"], "--steps must be positive"),
        (["--student", "draft", "--prompts", "/nonexistent.jsonl"], "no such file"),
        (["--student", "eagle", "--val-fraction", "1"], "--val-fraction must be in [0, 1)"),
        (["--student", "medusa", "--val-fraction", "0.1"], "--val-fraction scores EAGLE"),
        (["--student", "eagle", "--val-fraction", "0.1", "--eval-every", "-1"], "--eval-every must be >= 0"),
    ],
)
def test_distill_bad_input_is_one_line(tmp_path, capsys, argv, message):
    assert main(["distill", "--out", str(tmp_path / "x")] + argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
