"""The sliding-window pool (BlockManager with sliding_window) and the two-pool HybridBlockManager: blocks behind
every row's window go back to the pool, prefix-cache hits need only the window's blocks (ints only)."""

from speclm.kv.block_manager import EVICTED, BlockManager
from speclm.kv.hybrid import FULL, LOCAL, HybridBlockManager


def held(bm: BlockManager, seq_id: str) -> int:
    return sum(b != EVICTED for b in bm.block_table(seq_id))


def test_decoding_holds_the_window_and_one_block():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False, sliding_window=8)
    bm.allocate("s", list(range(10)))
    assert bm.ensure_slots("s", 0, 10) == [] and held(bm, "s") == 3  # a prompt's rows: no drop before them
    most = 0
    for p in range(10, 64):
        assert bm.ensure_slots("s", p, p + 1) == []
        most = max(most, held(bm, "s"))
        slots = bm.slot_ids("s", 0, p + 1)
        assert len(slots) >= 8  # the row at p still has its whole window ...
        assert slots[-8:] == [bm.block_table("s")[i // 4] * 4 + i % 4 for i in range(p - 7, p + 1)]
    assert most == 8 // 4 + 1 and bm.num_used_blocks == held(bm, "s")  # ... and no more than it and one block
    bm.free("s")
    assert bm.num_used_blocks == 0


def test_drafts_do_not_slide_the_window_of_the_row_before_them():
    """A step's drafts are written after its first row: the blocks that row reads stay."""
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=False, sliding_window=8)
    bm.allocate("s", list(range(12)))
    bm.ensure_slots("s", 0, 12)
    bm.ensure_slots("s", 12, 13)  # the pending token at 12 reads 5..12: block 1 stays
    bm.ensure_slots("s", 13, 17, first_row=12)  # its drafts
    assert bm.block_table("s")[:2] == [EVICTED, 1] and bm.slot_ids("s", 5, 13)[0] == 5
    bm.ensure_slots("s", 16, 17)  # after a step that accepted all of them: the row at 16 reads 9..16
    assert bm.block_table("s")[:3] == [EVICTED, EVICTED, 2]


def test_a_prefix_hit_needs_only_the_blocks_under_the_window():
    full = BlockManager(num_blocks=8, block_size=4)
    local = BlockManager(num_blocks=4, block_size=4, sliding_window=8)
    bm = HybridBlockManager(full, local)
    tokens = list(range(100, 121))
    assert bm.allocate("a", tokens[:17]) == 0
    for start, end in ((0, 8), (8, 16), (16, 17), (17, 18), (18, 19), (19, 20), (20, 21)):  # chunked, then decoding
        assert bm.ensure_slots("a", start, end) is not None
        bm.mark_computed("a", tokens, end)
    # 4 local blocks: the slid-out ones stayed cached until new ones were needed (least recently freed first)
    assert local.block_table("a")[:3] == [EVICTED] * 3 and held(local, "a") == 3
    bm.free("a")
    assert full.num_cached_blocks == 5 and local.num_cached_blocks == 3  # blocks 0 and 1 of the local pool are gone
    # rows from 16 on read 9..: the local pool has blocks 2 and 3, the full pool all four
    assert bm.allocate("b", tokens[:16] + [1]) == 16
    assert local.block_table("b")[:2] == [EVICTED, EVICTED] and held(local, "b") == 2 and held(full, "b") == 4
    # rows from 8 (or 4) on would read local block 0: gone, so nothing is reused although the full pool has it
    assert bm.allocate("c", tokens[:8] + [1]) == 0 and full.block_table("c") == local.block_table("c") == []
    assert bm.stats.hit_tokens == 16
    for seq_id in ("b", "c"):
        bm.free(seq_id)
    assert full.num_used_blocks == local.num_used_blocks == 0


def test_hybrid_slots_are_given_in_both_pools_or_in_neither():
    bm = HybridBlockManager(BlockManager(8, 4, False), BlockManager(2, 4, False, sliding_window=4))
    bm.allocate("a", [1] * 12)
    assert bm.ensure_slots("a", 0, 12) is None  # the prompt's 3 blocks do not fit the local pool of 2
    assert bm.full.block_table("a") == [] and bm.local.block_table("a") == []
    assert bm.ensure_slots("a", 0, 8) == []
    bm.fork("a", "b")
    assert bm.ensure_slots("b", 7, 8) is None  # b rewrites shared block 1: no free local block to copy it to
    assert bm.full.block_table("b") == bm.full.block_table("a") and bm.full.num_used_blocks == 2
    bm.free("a")  # b owns them alone now: no copy
    assert bm.ensure_slots("b", 7, 8) == [] and bm.local.block_table("b") == [EVICTED, 1]
    bm.fork("b", "d")
    copies = bm.ensure_slots("d", 7, 8)  # a copy in each pool, each named by its pool
    assert copies == [(FULL, 1, 2), (LOCAL, 1, 0)]
    assert bm.full.block_table("d") == [0, 2] and bm.local.block_table("d") == [EVICTED, 0]
    for seq_id in ("b", "d"):
        bm.free(seq_id)
    assert bm.full.num_used_blocks == bm.local.num_used_blocks == 0
