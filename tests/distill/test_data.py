"""Target data: the benchmark split, caching, and what gets recorded."""

import json

import pytest
import torch

import speclm.distill.data as data_module
from speclm import SamplingParams
from speclm.data import load_prompts
from speclm.distill.data import DataSettings, frequent_tokens, load_or_build, target_features
from speclm.distill.prompts import BENCHMARK_PER_CATEGORY, OWN_PROMPTS, split_specbench, training_prompts
from tests.conftest import SPECBENCH


def test_training_prompts_exclude_every_benchmark_prompt():
    bench = {p["text"] for p in load_prompts(SPECBENCH, per_category=BENCHMARK_PER_CATEGORY)}
    train = training_prompts(SPECBENCH)
    assert not bench & set(train)
    assert set(OWN_PROMPTS) <= set(train) and len(OWN_PROMPTS) >= 40
    bench_split, train_split = split_specbench(SPECBENCH)
    assert set(bench_split) == bench
    with open(SPECBENCH) as f:
        rows = [json.loads(line) for line in f]
    assert len(bench_split) + len(train_split) == len(rows)
    # the file has 40 prompts in 5 categories and 5 in 8 others: 5 * 30 trainable
    assert len(train_split) == 150


def test_frequent_tokens():
    counts = torch.tensor([5, 0, 9, 5, 1])
    assert frequent_tokens(counts, 3).tolist() == [0, 2, 3]  # ties broken by lower id
    assert frequent_tokens(counts, 3, always=[1]).tolist() == [0, 1, 2]


def test_target_data_is_cached_and_consistent(stories_llm, tmp_path, monkeypatch):
    settings = DataSettings(max_new_tokens=6, chat=False, batch_size=2)
    prompts = ["Once upon a time", "The cat sat"]
    data, path = load_or_build(stories_llm, "fp32", prompts, settings, str(tmp_path))
    assert len(data) == 2 and data.features.dtype == torch.bfloat16
    tokens, features, prompt_len = data.sequence(1)
    assert tokens[:prompt_len].tolist() == stories_llm.tokenizer.encode("The cat sat")
    # the response is the target's greedy continuation, and the features are its hidden states
    plain = stories_llm.generate("The cat sat", SamplingParams(max_tokens=6))[0]
    assert tokens[prompt_len:].tolist() == plain.token_ids
    expect = target_features(stories_llm.model, tokens.tolist())
    torch.testing.assert_close(features, expect.to(torch.bfloat16).float())
    assert int(data.token_counts.sum()) == sum(
        int(data.offsets[i + 1] - data.offsets[i]) - int(data.prompt_lengths[i]) for i in range(2)
    )

    # a second call reads the file instead of generating; other settings miss the cache
    def no_build(*args):
        raise AssertionError("rebuilt instead of reusing the cache")

    monkeypatch.setattr(data_module, "build_target_data", no_build)
    again, path2 = load_or_build(stories_llm, "fp32", prompts, settings, str(tmp_path))
    assert path2 == path and torch.equal(again.tokens, data.tokens) and torch.equal(again.features, data.features)
    with pytest.raises(AssertionError, match="rebuilt"):
        load_or_build(stories_llm, "fp32", prompts, DataSettings(max_new_tokens=7, chat=False), str(tmp_path))
