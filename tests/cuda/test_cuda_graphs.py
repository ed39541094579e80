"""CUDA graphs and batch-invariant linears on the GPU: a replayed decode or verification step's logits are
the eager step's bit for bit, generation with graphs equals generation without (plain, speculative,
batched), and a row's logits do not depend on how many rows share the pass (bf16 included)."""

from __future__ import annotations

import pytest
import torch

from speclm import SamplingParams
from speclm.engine.decode_graphs import BUCKETS, SHORT_TABLE
from speclm.engine.model_runner import ModelRunner
from speclm.models.attention import BatchEntry
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER
from tests.cuda.conftest import DEVICE, PROMPTS, needs_cuda
from tests.engine.test_decode_graphs import entries

pytestmark = needs_cuda

GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


def random_pool(llm):
    """An engine of its own over `llm` (its pool filled with noise: the shared fixtures' pools stay clean)."""
    llm = llm.with_engine()
    g = torch.Generator(device=llm.engine.cache.keys.device).manual_seed(0)
    for t in (llm.engine.cache.keys, llm.engine.cache.values):
        t.copy_(torch.randn(t.shape, generator=g, device=t.device))
    return llm


def decode_entries(count: int, start: int = 9) -> list[BatchEntry]:
    return [
        BatchEntry(tokens=[3 + i], start=start, slots=[100 * i + j for j in range(start + 1)], num_logits=1)
        for i in range(count)
    ]


@pytest.mark.parametrize("precision", ["fp32", "half"])
def test_graph_steps_return_the_eager_logits_bit_for_bit(precision, stories_gpu_fp32, stories_gpu):
    llm = random_pool(stories_gpu_fp32 if precision == "fp32" else stories_gpu)
    cache, runner = llm.engine.cache, llm.runner
    eager = ModelRunner(llm.model, decode_graphs="off")
    steps = [decode_entries(1), decode_entries(3), entries(), decode_entries(40), decode_entries(1, start=20)]
    # rows past SHORT_TABLE keys: graphs over the whole table (split-K attention)
    steps += [decode_entries(1, start=SHORT_TABLE + 30), decode_entries(2) + decode_entries(1, start=SHORT_TABLE + 30)]
    for step in steps * 2:  # first a graph's capture, then its replay
        logits, hidden, _ = runner.forward_batch(cache, step)
        expected, expected_hidden, _ = eager.forward_batch(cache, step)
        assert torch.equal(logits, expected), [len(e.tokens) for e in step]
        assert torch.equal(hidden, expected_hidden)
    graphs = runner.decode_graphs(cache)
    assert graphs.failed is None and graphs.mode == "graph"
    assert graphs.steps == 2 * len(steps)
    short, whole = SHORT_TABLE, graphs.width  # (no step of the second bucket has a long row)
    assert set(graphs.graphs) == {(BUCKETS[0], short), (BUCKETS[1], short), (BUCKETS[0], whole)}


def test_a_rows_logits_do_not_depend_on_the_rows_beside_it_in_half_precision(stories_gpu):
    llm = random_pool(stories_gpu)
    eager = ModelRunner(llm.model, decode_graphs="off")
    assert eager.batch_invariant
    alone = eager.forward_batch(llm.engine.cache, decode_entries(1))[0]
    for count in (2, 5, 17, 40):
        together = eager.forward_batch(llm.engine.cache, decode_entries(count))[0]
        assert torch.equal(together[:1], alone), count
    chain = [BatchEntry(tokens=[3, 4, 5, 6, 7], start=9, slots=list(range(14)), num_logits=5)]
    first = eager.forward_batch(llm.engine.cache, chain)[0][:1]
    assert torch.equal(first, alone)


@pytest.fixture(scope="module")
def stories_gpu_eager():
    from speclm import LLM

    return LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, device=DEVICE, cuda_graphs=False)


@pytest.mark.parametrize("spec", [None, "ngram", "layerskip:2"])
def test_graph_decoding_generates_the_eager_tokens(spec, stories_gpu, stories_gpu_eager):
    prompts = PROMPTS + [f"{PROMPTS[i % 3]} and" for i in range(12)]  # batched: several buckets
    with_graphs = stories_gpu.with_spec(spec, 4, adaptive=False)
    got = [o.token_ids for o in with_graphs.generate(prompts, GREEDY)]
    expected = [o.token_ids for o in stories_gpu_eager.with_spec(spec, 4, adaptive=False).generate(prompts, GREEDY)]
    assert got == expected
    graphs = with_graphs.runner.decode_graphs(with_graphs.engine.cache)
    assert graphs.failed is None and graphs.captures > 0 and graphs.steps > 0
