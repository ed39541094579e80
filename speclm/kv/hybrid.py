"""Two KV pools for models that mix full-attention and sliding-window layers (gemma3): the full layers keep
every token, the sliding-window (local) layers only their window.

As llama.cpp's SWA cache and vLLM's hybrid allocator do, the local layers get a pool and block tables of
their own: a sequence's local blocks that slid out of the window of every row still to run go back to
their pool (speclm/kv/block_manager.py, `sliding_window`), so a long sequence holds its window plus a
block or so in each local layer instead of its whole length. The two managers move together: a
sequence is allocated, given slots, forked and freed in both, and a prefix-cache hit is the longest
prefix both pools can serve (the local pool needs only the blocks under the window of its first new row).
"""

from __future__ import annotations

from speclm.kv.block_manager import BlockManager, PrefixCacheStats, prefix_keys
from speclm.kv.paged_cache import PagedKVCache

FULL, LOCAL = 0, 1  # a hybrid block copy's pool: (pool, src, dst)


class HybridBlockManager:
    """The full layers' BlockManager and the local layers' (one with a sliding window), behind the
    interface the scheduler uses. Queries about "the pool" (sizes, free blocks, the StreamingLLM window,
    prefix-cache counters) answer for the full layers', which bounds a sequence's length."""

    def __init__(self, full: BlockManager, local: BlockManager) -> None:
        assert local.sliding_window is not None and full.sliding_window is None, "local layers slide"
        assert full.block_size == local.block_size and full.enable_prefix_caching == local.enable_prefix_caching
        self.full, self.local = full, local
        self.block_size = full.block_size
        self.num_blocks = full.num_blocks
        self.window_blocks = full.window_blocks
        self.enable_prefix_caching = full.enable_prefix_caching

    # -- queries ---------------------------------------------------------------------------
    @property
    def stats(self) -> PrefixCacheStats:
        return self.full.stats

    @property
    def num_free_blocks(self) -> int:
        return self.full.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.full.num_used_blocks

    @property
    def num_cached_blocks(self) -> int:
        return self.full.num_cached_blocks

    def has(self, seq_id: str) -> bool:
        return self.full.has(seq_id)

    def block_table(self, seq_id: str) -> list[int]:
        return self.full.block_table(seq_id)

    def slot_ids(self, seq_id: str, start: int, end: int) -> list[int]:
        """The full layers' slots of tokens start..end-1."""
        return self.full.slot_ids(seq_id, start, end)

    def local_slot_ids(self, seq_id: str, start: int, end: int) -> list[int]:
        """The local layers' slots of those of tokens start..end-1 their pool still holds (a suffix)."""
        return self.local.slot_ids(seq_id, start, end)

    def blocks_needed(self, num_tokens: int) -> int:
        return self.full.blocks_needed(num_tokens)

    def eviction_free_end(self, seq_id: str) -> int | None:
        return self.full.eviction_free_end(seq_id)

    # -- lifecycle -------------------------------------------------------------------------
    def allocate(self, seq_id: str, token_ids: list[int], reuse_prefix: bool = True) -> int:
        """Start a sequence in both pools on the longest cached prefix both can serve; return its tokens."""
        keys = prefix_keys(token_ids, self.block_size) if self.enable_prefix_caching and reuse_prefix else []
        hit = self.local.longest_hit(keys, self.full.longest_hit(keys, len(keys)))
        self.full.attach(seq_id, keys, hit)
        self.local.attach(seq_id, keys, hit)
        if keys:
            self.stats.queried_tokens += len(token_ids)
            self.stats.hit_tokens += hit * self.block_size
        return hit * self.block_size

    def ensure_slots(
        self, seq_id: str, write_from: int, end: int, first_row: int | None = None
    ) -> list[tuple[int, int, int]] | None:
        """BlockManager.ensure_slots in both pools, or in neither (None) when either lacks free blocks.
        Returns the (pool, src, dst) block copies (copy-on-write) for HybridKVCache.copy_blocks."""
        self.local.slide(seq_id, write_from if first_row is None else first_row)
        if self.local.blocks_wanted(seq_id, write_from, end) > self.local.num_free_blocks:
            return None
        full = self.full.ensure_slots(seq_id, write_from, end, first_row)
        if full is None:
            return None
        local = self.local.ensure_slots(seq_id, write_from, end, first_row)
        assert local is not None, seq_id
        return [(FULL, src, dst) for src, dst in full] + [(LOCAL, src, dst) for src, dst in local]

    def mark_computed(self, seq_id: str, token_ids: list[int], num_computed: int) -> None:
        self.full.mark_computed(seq_id, token_ids, num_computed)
        self.local.mark_computed(seq_id, token_ids, num_computed)

    def fork(self, parent_id: str, child_id: str) -> None:
        self.full.fork(parent_id, child_id)
        self.local.fork(parent_id, child_id)

    def free(self, seq_id: str) -> None:
        self.full.free(seq_id)
        self.local.free(seq_id)


class HybridKVCache:
    """The tensors of the two pools: the full layers' PagedKVCache and the local layers' (each layer
    stored in the pool of its kind; `local_layers[i]` says which)."""

    def __init__(self, full: PagedKVCache, local: PagedKVCache, local_layers: list[bool]) -> None:
        self.full, self.local = full, local
        self.pools = (full, local)
        index = {False: 0, True: 0}
        self._where = []  # layer -> (pool, its index there)
        for is_local in local_layers:
            self._where.append((local if is_local else full, index[is_local]))
            index[is_local] += 1
        self.dtype, self.quantize, self.block_size = full.dtype, full.quantize, full.block_size

    @property
    def nbytes(self) -> int:
        return self.full.nbytes + self.local.nbytes

    def layer(self, index: int):
        pool, i = self._where[index]
        return pool.layer(i)

    def copy_blocks(self, copies: list[tuple[int, int, int]]) -> None:
        """HybridBlockManager's (pool, src, dst) copies."""
        for pool, src, dst in copies:
            self.pools[pool].copy_blocks([(src, dst)])

    def move_slots(self, src: list[int], dst: list[int], local_src: list[int], local_dst: list[int]) -> None:
        """PagedKVCache.move_slots in each pool, with that pool's slots."""
        self.full.move_slots(src, dst)
        self.local.move_slots(local_src, local_dst)
