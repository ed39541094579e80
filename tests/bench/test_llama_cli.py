"""Reading llama.cpp's example programs' output (speclm bench --peers llama.cpp,llama-speculative,...)."""

import os
import stat

import pytest

from speclm.bench.llama_cli import LlamaCliPeer, same_text

PROMPT = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"

SPECULATIVE_ERR = """I encoded    4 tokens in    0.404 seconds, speed:    9.904 t/s
I decoded   41 tokens in    5.484 seconds, speed:    7.477 t/s
I n_draft   = 8
I n_predict = 41
I n_drafted = 40
I n_accept  = 35
"""

COMPLETION_ERR = """common_perf_print: prompt eval time =    2317.16 ms /    49 tokens (   47.29 ms per token)
common_perf_print:        eval time =    1500.00 ms /    31 runs   (   48.39 ms per token)
"""


@pytest.fixture
def bin_dir(tmp_path):
    for name in ("llama-completion", "llama-speculative", "llama-lookup"):
        path = tmp_path / name
        path.write_text("#!/bin/sh\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(tmp_path)


def test_speculative_output_is_parsed_and_the_echoed_prompt_dropped(bin_dir):
    peer = LlamaCliPeer("llama-speculative", bin_dir, "t.gguf", 2, draft="d.gguf", k=6)
    assert "--spec-draft-n-max" in peer.command("p.txt", 32) and "d.gguf" in peer.command("p.txt", 32)
    run = peer.parse("\n\n" + PROMPT.rstrip() + "Hello there!\n\n", SPECULATIVE_ERR, PROMPT)
    assert (run.text, run.tokens, run.decode_seconds, run.prefill_seconds) == ("Hello there!", 41, 5.484, 0.404)
    assert (run.drafted, run.accepted) == (40, 35)


def test_completion_output_is_parsed(bin_dir):
    run = LlamaCliPeer("llama.cpp", bin_dir, "t.gguf", 2).parse("Hello there!\n\n", COMPLETION_ERR, PROMPT)
    assert (run.text, run.tokens, run.prefill_seconds, run.decode_seconds) == ("Hello there!", 32, 2.31716, 1.5)


def test_missing_program_or_draft_is_a_clear_error(bin_dir, tmp_path):
    with pytest.raises(ValueError, match="needs a draft model"):
        LlamaCliPeer("llama-speculative", bin_dir, "t.gguf", 2)
    with pytest.raises(ValueError, match="llama-lookup"):
        LlamaCliPeer("llama-lookup", os.path.join(str(tmp_path), "nowhere"), "t.gguf", 2)
    with pytest.raises(ValueError, match="unknown llama.cpp peer"):
        LlamaCliPeer("llama-server", bin_dir, "t.gguf", 2)


def test_same_text_compares_the_common_length():
    assert same_text("abc def", "abc de")
    assert same_text("abc\n\n", "abc")
    assert not same_text("abc def", "abd")
