"""Sliding-window layers on the GPU (a random gemma3 checkpoint, window 8, which the prompt and the
generated tokens pass): fp32 greedy equals the CPU's, n-gram speculation equals plain decoding in bf16, and
CUDA graphs generate the eager tokens."""

from __future__ import annotations

import dataclasses

import pytest

from speclm import SamplingParams
from tests.cuda.conftest import DEVICE, needs_cuda

pytestmark = needs_cuda

GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [3, 4, 5], [9] * 20]


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory) -> str:
    transformers = pytest.importorskip("transformers")
    from tests.models.hf_tiny import tiny_hf_model
    from tests.models.test_families import GEMMA3, _word_tokenizer

    path = tmp_path_factory.mktemp("gemma3")
    hf_model = tiny_hf_model(transformers.Gemma3TextConfig, **GEMMA3)
    hf_model.save_pretrained(path)
    _word_tokenizer(path, hf_model.config.vocab_size)
    return str(path)


def outputs(llm, spec=None) -> list[list[int]]:
    return [o.token_ids for o in llm.with_spec(spec, 4, adaptive=False).generate(PROMPTS, GREEDY)]


def test_sliding_window_model_on_gpu(gemma3_dir):
    from speclm import LLM

    cpu = LLM(gemma3_dir, tokenizer=gemma3_dir, weights="fp32", device="cpu")
    fp32 = LLM(gemma3_dir, tokenizer=gemma3_dir, weights="fp32", device=DEVICE)
    assert outputs(fp32) == outputs(cpu)
    half = LLM(gemma3_dir, tokenizer=gemma3_dir, device=DEVICE)
    eager = LLM(gemma3_dir, tokenizer=gemma3_dir, device=DEVICE, cuda_graphs=False)
    plain = [o.token_ids for o in half.generate(PROMPTS, GREEDY)]
    assert outputs(half, "ngram") == plain
    assert outputs(eager) == plain
    # Decode graphs serve a model whose layers share one pool (CacheConfig(sliding_window_pool=False)); with
    # a pool per layer kind (the default) its steps run eagerly.
    masked = half.with_engine(dataclasses.replace(half.cache_config, sliding_window_pool=False))
    assert [o.token_ids for o in masked.generate(PROMPTS, GREEDY)] == plain
    graphs = masked.runner.decode_graphs(masked.engine.cache)
    assert graphs is not None and graphs.failed is None and graphs.steps > 0
