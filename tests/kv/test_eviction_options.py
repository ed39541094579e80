"""--kv-eviction / --kv-budget: validated on the command line, and honoured by generate and the server."""

import json

import httpx
import pytest

from speclm import SamplingParams
from speclm.cli import build_parser, main
from speclm.config import CacheConfig
from speclm.engine.engine import Engine
from speclm.engine.request import Request
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER
from tests.kv.test_eviction import STORY
from tests.server.conftest import running_server

STORIES = ["--model", STORIES_MODEL, "--tokenizer", STORIES_TOKENIZER, "--threads", "1"]


@pytest.mark.parametrize("command", ["serve", "generate"])
@pytest.mark.parametrize(
    "options, message",
    [
        (["--kv-eviction", "h2o", "--kv-budget", "0"], "kv_budget must be at least 8 tokens"),
        (["--kv-eviction", "lru", "--kv-budget", "64"], "unknown kv_eviction policy 'lru'"),
        (["--kv-eviction", "snapkv", "--kv-budget", "1.5"], "a fractional kv_budget must be in (0, 1), got 1.5"),
        (["--kv-eviction", "h2o", "--kv-budget", "half"], "--kv-budget takes tokens"),
        (["--kv-eviction", "h2o"], "needs a kv_budget"),
        (["--kv-budget", "64"], "needs a kv_eviction policy"),
    ],
)
def test_bad_eviction_options_print_one_error_line_and_exit_2(capsys, command, options, message):
    assert main([command, *STORIES, "--prompt", "x", *options] if command == "generate" else [command, *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"speclm {command}: error: ") and message in err[0]


def test_serve_options_reach_the_cache_config():
    from speclm.cli.serve import cache_config

    args = build_parser().parse_args(
        ["serve", "--kv-eviction", "snapkv", "--kv-budget", "0.25", "--attention-sinks", "8"]
    )
    config = cache_config(args)
    assert (config.kv_eviction, config.kv_budget, config.attention_sinks) == ("snapkv", 0.25, 8)
    args = build_parser().parse_args(["serve", "--kv-eviction", "streaming", "--kv-budget", "128"])
    assert cache_config(args).streaming_window == 128  # the StreamingLLM window, as --streaming-window 128


def _offline(llm, config, prompt, max_tokens):
    engine = Engine(llm.runner, llm.tokenizer, config)
    request = Request("r", llm.encode(prompt), SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    return engine.generate([request])[0][0]


def test_generate_with_h2o_equals_the_engine_with_that_cache(capsys):
    from speclm import LLM

    code = main(["generate", "--json", *STORIES, "--prompt", STORY, "--max-tokens", "60"])
    full = json.loads(capsys.readouterr().out)
    options = ["--kv-eviction", "h2o", "--kv-budget", "32"]
    assert main(["generate", "--json", *STORIES, "--prompt", STORY, "--max-tokens", "60", *options]) == code == 0
    evicted = json.loads(capsys.readouterr().out)
    llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, cache=CacheConfig(kv_eviction="h2o", kv_budget=32))
    expected = llm.generate(STORY, SamplingParams(max_tokens=60))[0]
    assert evicted["token_ids"] == expected.token_ids != full["token_ids"]


def test_server_serves_with_snapkv(stories_llm):
    config = CacheConfig(block_size=4, kv_eviction="snapkv", kv_budget=24)
    expected = _offline(stories_llm, config, STORY, 50)
    assert expected.token_ids != _offline(stories_llm, CacheConfig(block_size=4), STORY, 50).token_ids
    with running_server(stories_llm, config) as (url, app):
        body = {"prompt": STORY, "max_tokens": 50, "temperature": 0, "ignore_eos": True}
        r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected.text
        assert app.state.engine.engine.evictor is not None
