"""int8 KV cache: quantization error bound, memory, and generation close to the full-precision cache."""

import torch

from speclm import SamplingParams
from speclm.config import CacheConfig
from speclm.engine.engine import Engine
from speclm.engine.request import Request
from speclm.kv.paged_cache import PagedKVCache


def test_int8_slots_round_trip_within_half_a_step():
    cache = PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=8, num_blocks=4, block_size=4, quantize=True)
    keys, _ = cache.layer(0)
    x = torch.randn(2, 5, 8) * torch.tensor([0.01, 10.0])[:, None, None]  # very different head scales
    slots = torch.tensor([3, 7, 8, 12, 15])
    keys[:, slots] = x
    step = x.abs().amax(-1, keepdim=True) / 127
    assert ((keys[:, slots] - x).abs() <= step / 2 + 1e-7).all()
    assert cache.keys.dtype == torch.int8
    full = PagedKVCache(num_layers=1, num_kv_heads=2, head_dim=8, num_blocks=4, block_size=4)
    assert cache.nbytes * 8 == full.nbytes * (8 + 4) // 4  # 1 byte per value + a 4-byte scale per head and slot


def test_int8_cache_generation_tracks_full_precision(stories_llm):
    runner = stories_llm.runner
    prompts = [
        "Once upon a time",
        "Tom had a dog",
        "The sun was hot and the",
        "One day, a little bird",
        "Sam liked to eat",
    ]
    requests = [Request(str(i), stories_llm.encode(p), SamplingParams(max_tokens=24)) for i, p in enumerate(prompts)]
    full = Engine(runner, stories_llm.tokenizer, CacheConfig(block_size=4))
    int8 = Engine(runner, stories_llm.tokenizer, CacheConfig(block_size=4, kv_cache_dtype="int8"))
    expected = [o[0].token_ids for o in full.generate(requests)]
    got = [o[0].token_ids for o in int8.generate(requests)]
    # head_dim 8 is the worst case for the per-head scale overhead: 12 bytes instead of 32 per head and token
    assert int8.cache.nbytes / full.cache.nbytes == 12 / 32
    # greedy agreement: the first token matches for every prompt, most outputs match entirely (measured: 4 of 5)
    assert all(g[0] == e[0] for g, e in zip(got, expected))
    assert sum(g == e for g, e in zip(got, expected)) >= 3
    assert int8.block_manager.num_used_blocks == 0


def test_streaming_window_generates_past_the_cache_with_bounded_blocks(stories_llm):
    runner = stories_llm.runner
    prompt = stories_llm.encode("Once upon a time")
    params = SamplingParams(max_tokens=150, ignore_eos=True)
    full = Engine(runner, stories_llm.tokenizer, CacheConfig(block_size=4)).generate([Request("f", prompt, params)])[0][
        0
    ]
    # 12 blocks of 4 tokens: 48 tokens of KV for a 155-token sequence
    engine = Engine(
        runner, stories_llm.tokenizer, CacheConfig(block_size=4, num_blocks=16, streaming_window=48, attention_sinks=4)
    )
    engine.add_request(Request("s", prompt, params))
    tokens, peak = [], 0
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.token_ids
        peak = max(peak, engine.block_manager.num_used_blocks)
    assert len(tokens) == 150 and peak == 12
    # identical to the full cache until the window first slides, different (but still text) after
    first_eviction = 48 - len(prompt)
    assert tokens[:first_eviction] == full.token_ids[:first_eviction]
    assert tokens != full.token_ids
    assert engine.block_manager.num_used_blocks == 0


def test_streaming_window_with_speculation_equals_plain_streaming_decoding(stories_llm):
    """Drafts must not make the window slide earlier than plain decoding would: a step's rows stay
    in the block of its first row (where plain decoding of that row would evict too)."""
    from speclm.config import SpecConfig

    runner = stories_llm.runner
    prompts = ["Once upon a time", "Tom had a dog. Tom had a dog. Tom"]
    params = SamplingParams(max_tokens=120, ignore_eos=True)
    config = dict(block_size=4, num_blocks=32, streaming_window=40, attention_sinks=4)
    requests = [Request(str(i), stories_llm.encode(p), params) for i, p in enumerate(prompts)]
    plain = Engine(runner, stories_llm.tokenizer, CacheConfig(**config)).generate(requests)
    for spec in ("ngram", "layerskip:3"):
        engine = Engine(
            runner,
            stories_llm.tokenizer,
            CacheConfig(**config),
            SpecConfig.parse(spec, 4, adaptive=False),
            stories_llm.proposers,
        )
        outs = engine.generate(requests)
        for got, want in zip(outs, plain):
            assert got[0].token_ids == want[0].token_ids, spec
        assert sum(o[0].stats.accepted_tokens for o in outs) > 0, spec  # drafts were accepted
