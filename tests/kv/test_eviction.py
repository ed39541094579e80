"""Token-granular KV eviction (H2O, SnapKV): the policies' choices, the budget in the paged cache, and
outputs against the full cache and against speculative decoding with the same eviction."""

import math

import pytest
import torch

from speclm import SamplingParams
from speclm.config import CacheConfig, SpecConfig
from speclm.engine.engine import Engine
from speclm.engine.request import Request
from speclm.kv.block_manager import BlockManager
from speclm.kv.eviction import EvictionPlan, SequenceEviction
from speclm.kv.paged_cache import PagedKVCache
from speclm.models.attention import BatchEntry

STORY = (
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, "
    "she saw a big red ball under a tree. She ran to get it, and her dog Max ran with her. Then"
)


def test_h2o_keeps_sinks_recent_and_the_highest_scores_per_layer_and_head():
    plan = EvictionPlan.of("h2o", budget=14, batch=2, sinks=2, prompt_tokens=14)
    assert (plan.keep, plan.recent) == (12, 5)
    state = SequenceEviction(plan, num_layers=2, num_kv_heads=2)
    state.append(list(range(14)))
    scores = torch.rand(2, 2, 14)
    scores[0, 0, 4], scores[0, 0, 6] = -1.0, -2.0  # (layer 0, head 0) drops 4 and 6
    scores[1, 1, 2], scores[1, 1, 5] = -1.0, -2.0  # (layer 1, head 1) drops 2 and 5
    scores[..., :2] = -5.0  # sinks stay whatever their score
    scores[..., 9:] = -5.0  # and so do the 5 most recent tokens
    state.add_weights(scores)
    kept = state.select(next_position=14)
    assert kept.shape == (2, 2, 12) and state.held == 12
    expected_dropped = {(0, 0): {4, 6}, (1, 1): {2, 5}}
    for layer in range(2):
        for head in range(2):
            dropped = set(range(14)) - set(state.positions[layer, head].tolist())
            lowest = set(torch.topk(scores[layer, head, 2:9], 2, largest=False).indices.add(2).tolist())
            assert dropped == expected_dropped.get((layer, head), lowest), (layer, head)
            assert state.positions[layer, head].tolist() == sorted(state.positions[layer, head].tolist())
    # scores travel with their tokens
    assert torch.equal(state.scores, scores.gather(-1, kept))


def test_block_manager_compaction_frees_blocks_and_privatises_shared_ones():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    bm.allocate("p", [])
    bm.ensure_slots("p", 0, 10)  # 3 blocks
    bm.fork("p", "c")
    bm.compact("c", 10, 5)  # c keeps 5 entries: 2 blocks of its own, the parent's untouched
    assert bm.block_table("p") == [0, 1, 2] and bm.ref_counts[:3] == [1, 1, 1]
    assert len(bm.block_table("c")) == 2 and not set(bm.block_table("c")) & {0, 1, 2}
    # token 10 (the next) is entry 5: the slot after the kept ones (5 tokens were dropped)
    assert bm.slot_ids("c", 10, 11) == bm.slot_ids("c", 0, 11)[5:]
    assert bm.slot_ids("c", 0, 10) == bm.slot_ids("c", 0, 10)[:5] and len(bm.slot_ids("c", 0, 11)) == 6
    assert bm.ensure_slots("c", 10, 12) == [] and len(bm.block_table("c")) == 2
    bm.free("p")
    bm.free("c")
    assert bm.num_used_blocks == 0


def test_paged_cache_compaction_moves_each_heads_own_entries():
    cache = PagedKVCache(num_layers=2, num_kv_heads=2, head_dim=4, num_blocks=4, block_size=4)
    src = [4, 5, 6, 7, 8]
    cache.keys[:, :, src] = torch.arange(5.0)[:, None]  # entry i holds the value i
    kept = torch.tensor([[[0, 2], [1, 4]], [[3, 4], [0, 1]]])
    cache.compact(src, kept, [12, 13])
    assert torch.equal(cache.keys[:, :, [12, 13], 0], kept.float())


def _run(engine, prompt, params, watch=None):
    """Generate one request step by step; watch(state) after every step that leaves it decoding."""
    engine.add_request(Request("r", prompt, params))
    tokens = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens += out.token_ids
        state = engine.sequences.get("r#0")
        if watch and state is not None and state.seq.output_ids:
            watch(engine, state)
    return tokens


@pytest.mark.parametrize("policy, dtype", [("h2o", "auto"), ("snapkv", "auto"), ("h2o", "int8")])
def test_budget_holds_with_sinks_and_recent_tokens_kept(stories_llm, policy, dtype):
    prompt = stories_llm.encode(STORY)
    budget, seen = 32, []
    config = CacheConfig(block_size=4, kv_eviction=policy, kv_budget=budget, attention_sinks=4, kv_cache_dtype=dtype)
    engine = Engine(stories_llm.runner, stories_llm.tokenizer, config)

    def watch(engine, state):
        ev, seq = state.eviction, state.seq
        if seq.num_computed < len(prompt) or not ev.num_evictions:
            return  # the prompt is prefilled whole, then cut before the first decoding step
        assert ev.held <= budget and ev.held == len(engine.block_manager.slot_ids(seq.seq_id, 0, seq.num_computed))
        assert engine.block_manager.num_used_blocks <= math.ceil(budget / 4)
        for positions in ev.positions.reshape(-1, ev.held).tolist():
            assert set(range(4)) <= set(positions)  # sinks
            recent = range(seq.num_computed - ev.plan.recent, seq.num_computed)
            if policy == "h2o":
                assert set(recent) <= set(positions)
        seen.append(ev.held)

    tokens = _run(engine, prompt, SamplingParams(max_tokens=80, ignore_eos=True), watch)
    assert len(tokens) == 80 and len(prompt) > budget
    assert min(seen) == budget - config.eviction_batch(budget) + 1 and max(seen) == budget  # cut, then one token
    assert engine.block_manager.num_used_blocks == 0


def test_snapkv_selection_matches_a_reference_from_attention_weights(stories_llm):
    runner, prompt = stories_llm.runner, stories_llm.encode(STORY)
    budget, sinks, n = 40, 4, len(prompt)
    config = CacheConfig(block_size=4, kv_eviction="snapkv", kv_budget=budget, attention_sinks=sinks)
    engine = Engine(runner, stories_llm.tokenizer, config)
    engine.add_request(Request("r", prompt, SamplingParams(max_tokens=2, ignore_eos=True)))
    engine.step()  # the prompt
    state = engine.sequences.get("r#0").eviction
    engine.step()  # cut, then the first decoding step
    plan, window = state.plan, state.plan.recent
    # reference: the prompt's queries and keys from a full-cache pass, weights by the textbook formula
    cache = runner.new_paged_cache(num_blocks=math.ceil(n / 4), block_size=4)
    queries = []
    runner.forward_batch(cache, [BatchEntry(prompt, 0, list(range(n)), 0)], queries)
    c = runner.config
    group = c.num_heads // c.num_kv_heads
    for layer in range(c.num_layers):
        keys = cache.keys[layer, :, :n]  # [kv_heads, n, head_dim]
        for head in range(c.num_kv_heads):
            votes = torch.zeros(n)
            for row in range(n - window, n):
                for q in queries[layer][head * group : (head + 1) * group, row]:
                    votes[: row + 1] += torch.softmax((keys[head, : row + 1] @ q) / math.sqrt(c.head_dim), 0)
            votes[n - window :] = 0
            pooled = torch.tensor([votes[max(0, i - 3) : i + 4].max() for i in range(n)])
            candidates = list(range(sinks, n - window))
            top = sorted(candidates, key=lambda i: -pooled[i])[: plan.keep - sinks - window]
            expected = sorted(set(range(sinks)) | set(top) | set(range(n - window, n)))
            assert state.positions[layer, head, : plan.keep].tolist() == expected, (layer, head)


def _generate(llm, config, prompt, params, spec=None):
    engine = Engine(
        llm.runner, llm.tokenizer, config, SpecConfig.parse(spec, 4, adaptive=False) if spec else None, llm.proposers
    )
    return engine.generate([Request("r", prompt, params)])[0][0]


@pytest.mark.parametrize("policy", ["h2o", "snapkv"])
def test_speculative_output_equals_plain_output_under_eviction(stories_llm, policy):
    """Drafts never cause an eviction plain decoding would not make, and rejected rows never score."""
    prompt = stories_llm.encode(STORY + " Lily and Max ran to the ball. Lily and Max ran to the")
    params = SamplingParams(max_tokens=100, ignore_eos=True)
    config = CacheConfig(block_size=4, kv_eviction=policy, kv_budget=36)
    plain = _generate(stories_llm, config, prompt, params)
    full = _generate(stories_llm, CacheConfig(block_size=4), prompt, params)
    assert plain.token_ids != full.token_ids  # the eviction changed the text: the comparison means something
    spec = _generate(stories_llm, config, prompt, params, "ngram")
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted_tokens > 0


@pytest.mark.parametrize("policy", ["h2o", "snapkv"])
def test_budget_above_the_sequence_gives_the_full_cache_output(stories_llm, policy):
    prompt = stories_llm.encode(STORY)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    full = _generate(stories_llm, CacheConfig(block_size=4), prompt, params)
    evicting = _generate(
        stories_llm, CacheConfig(block_size=4, kv_eviction=policy, kv_budget=len(prompt) + 40), prompt, params
    )
    assert evicting.token_ids == full.token_ids


def test_runs_without_h2o_or_snapkv_compute_no_attention_weights(stories_llm, monkeypatch):
    import speclm.engine.eviction as eviction

    def refuse(*args):
        raise AssertionError("attention weights computed without an evicting policy")

    monkeypatch.setattr(eviction, "attention_weights", refuse)
    for config in (CacheConfig(block_size=4), CacheConfig(block_size=4, kv_eviction="streaming", kv_budget=24)):
        engine = Engine(stories_llm.runner, stories_llm.tokenizer, config)
        assert engine.evictor is None
        engine.generate([Request("r", stories_llm.encode(STORY), SamplingParams(max_tokens=20, ignore_eos=True))])
    with pytest.raises(AssertionError, match="attention weights"):
        _generate(stories_llm, CacheConfig(block_size=4, kv_eviction="h2o", kv_budget=24), [1, 2, 3], SamplingParams())


def test_cache_config_validates_the_eviction_options():
    for bad, message in [
        (dict(kv_eviction="lru", kv_budget=64), "unknown kv_eviction"),
        (dict(kv_eviction="h2o"), "needs a kv_budget"),
        (dict(kv_budget=64), "needs a kv_eviction"),
        (dict(kv_eviction="h2o", kv_budget=0), "at least 8 tokens"),
        (dict(kv_eviction="snapkv", kv_budget=1.0), r"in \(0, 1\)"),
        (dict(kv_eviction="streaming", kv_budget=0.5), "budget in tokens"),
        (dict(kv_eviction="h2o", kv_budget=64, streaming_window=64), "does not combine"),
    ]:
        with pytest.raises(ValueError, match=message):
            CacheConfig(**bad)
    assert CacheConfig(kv_eviction="streaming", kv_budget=64).streaming_window == 64
    fraction = CacheConfig(kv_eviction="h2o", kv_budget=0.25)
    assert fraction.budget_tokens(1000) == 250 and fraction.budget_tokens(10) == fraction.min_kv_budget


def test_gather_keys_reads_whole_blocks_or_slots_alike():
    cache = PagedKVCache(num_layers=2, num_kv_heads=2, head_dim=4, num_blocks=6, block_size=4)
    cache.keys.copy_(torch.randn_like(cache.keys))
    for slots in ([8, 9, 10, 11, 20, 21], [20, 21, 22, 23, 4, 5, 6, 7, 12], [3, 9, 1]):  # blocks 2, 5 / 5, 1, 3 / none
        assert torch.equal(cache.gather_keys(slots), cache.keys[:, :, slots])
