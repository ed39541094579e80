"""BlockManager: allocation, ref counts, copy-on-write, prefix hash chain, LRU eviction (ints only)."""

from speclm.kv.block_manager import BlockManager


def test_allocate_and_free_returns_every_block():
    bm = BlockManager(num_blocks=4, block_size=4, enable_prefix_caching=False)
    assert bm.allocate("a", list(range(6))) == 0
    assert bm.ensure_slots("a", 0, 6) == []
    assert bm.block_table("a") == [0, 1]
    assert bm.slot_ids("a", 3, 6) == [3, 4, 5]
    assert bm.num_used_blocks == 2 and bm.ref_counts[:2] == [1, 1]
    bm.allocate("b", [1, 2])
    assert bm.ensure_slots("b", 0, 9) is None  # needs 3, only 2 free: nothing changes
    assert bm.block_table("b") == [] and bm.num_free_blocks == 2
    assert bm.ensure_slots("b", 0, 8) == []
    assert bm.num_free_blocks == 0
    bm.free("a")
    bm.free("b")
    assert bm.num_used_blocks == 0 and bm.ref_counts == [0, 0, 0, 0]


def test_fork_shares_blocks_and_copies_on_write():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("p", list(range(6)))
    bm.ensure_slots("p", 0, 6)
    bm.mark_computed("p", list(range(6)), 6)
    bm.fork("p", "c")
    assert bm.block_table("c") == bm.block_table("p") == [0, 1]
    assert bm.ref_counts[:2] == [2, 2]
    # the child writes token 6 into the shared partial block 1: it gets its own copy
    assert bm.ensure_slots("c", 6, 7) == [(1, 2)]
    assert bm.block_table("c") == [0, 2] and bm.ref_counts[:3] == [2, 1, 1]
    # the parent now owns block 1 alone: no copy
    assert bm.ensure_slots("p", 6, 7) == []
    bm.free("p")
    assert bm.ref_counts[:3] == [1, 0, 1]
    bm.free("c")
    assert bm.num_used_blocks == 0


def test_prefix_hash_chain_reuses_full_blocks_only_for_equal_prefixes():
    bm = BlockManager(num_blocks=8, block_size=4)
    prompt = list(range(10))
    assert bm.allocate("a", prompt) == 0
    bm.ensure_slots("a", 0, 10)
    bm.mark_computed("a", prompt, 10)
    assert bm.num_cached_blocks == 2  # two full blocks; the partial third is not cached
    # same first 8 tokens: both blocks are reused, the rest is computed
    assert bm.allocate("b", prompt[:8] + [99, 98, 97]) == 8
    assert bm.block_table("b") == bm.block_table("a")[:2] and bm.ref_counts[:2] == [2, 2]
    # same second block after a different first block: the chain hash does not match
    assert bm.allocate("c", [7, 7, 7, 7] + prompt[4:10]) == 0
    # a prompt made of exactly the cached blocks keeps its last token to compute
    assert bm.allocate("d", prompt[:8]) == 4
    assert bm.stats.queried_tokens == 10 + 11 + 10 + 8 and bm.stats.hit_tokens == 12


def test_unreferenced_cached_blocks_survive_until_evicted_lru():
    bm = BlockManager(num_blocks=3, block_size=2)
    for name, prompt in (("a", [1, 2, 3]), ("b", [4, 5, 6])):
        bm.allocate(name, prompt)
        bm.ensure_slots(name, 0, 2)
        bm.mark_computed(name, prompt, 2)
        bm.free(name)  # a's block freed first: least recently used
    assert bm.num_used_blocks == 0 and bm.num_cached_blocks == 2
    assert bm.allocate("b2", [4, 5, 0]) == 2  # still cached after its owner finished
    bm.free("b2")
    bm.allocate("x", [9])
    bm.ensure_slots("x", 0, 4)  # needs 2 blocks: the free one, then evicts a (oldest), not b
    assert bm.num_cached_blocks == 1
    assert bm.allocate("a2", [1, 2, 3]) == 0
    assert bm.allocate("b3", [4, 5, 6]) == 2


def test_copied_shared_full_block_leaves_cache_chain():
    bm = BlockManager(num_blocks=6, block_size=2)
    bm.allocate("p", [1, 2, 3])
    bm.ensure_slots("p", 0, 3)
    bm.mark_computed("p", [1, 2, 3], 3)
    bm.fork("p", "c")
    # rewriting from slot 1 (inside the shared, cached block 0) copies it and forgets its hash for c
    copies = bm.ensure_slots("c", 1, 3)
    assert [src for src, _ in copies] == [0, 1]
    bm.mark_computed("c", [1, 9, 9], 3)
    assert bm.allocate("q", [1, 9, 9]) == 2


def test_streaming_window_keeps_sinks_and_recent_blocks():
    from speclm.kv.block_manager import EVICTED

    bm = BlockManager(num_blocks=4, block_size=2, enable_prefix_caching=False, window_blocks=3, sink_blocks=1)
    bm.allocate("s", [1, 2, 3])
    assert bm.eviction_free_end("s") == 6  # no block held yet: the window has room for 3
    assert bm.ensure_slots("s", 0, 6) == []  # 3 blocks: exactly the window
    assert bm.block_table("s") == [0, 1, 2] and bm.eviction_free_end("s") == 6
    assert bm.ensure_slots("s", 6, 7) == []  # a 4th block: the oldest non-sink block (1) is dropped first
    assert bm.block_table("s") == [0, EVICTED, 2, 1] and bm.num_used_blocks == 3
    assert bm.eviction_free_end("s") == 8  # the window is full: the next block evicts
    assert bm.slot_ids("s", 0, 7) == [0, 1, 4, 5, 2]  # positions 2, 3 are gone
    bm.ensure_slots("s", 8, 9)
    assert bm.block_table("s") == [0, EVICTED, EVICTED, 1, 2]
    bm.free("s")
    assert bm.num_used_blocks == 0
