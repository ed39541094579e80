"""Paged KV-cache bookkeeping in plain integers: blocks, ref counts, block tables, prefix cache, LRU.

No tensors here: the scheduler asks this class which cache slots each sequence owns, and the model
runner turns those slot numbers into gathers. A block holds `block_size` consecutive tokens of one
or more sequences (shared by reference count). Full blocks are keyed by a hash chain of their tokens
so that a later prompt with the same prefix reuses them; unreferenced cached blocks stay readable
until the free list runs dry, then the least recently freed one is evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class _SequenceBlocks:
    """One sequence's block table and how far its full blocks have been entered in the prefix cache."""

    blocks: list[int] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chain hashes of the leading full, computed blocks
    dropped: int = 0  # token-granular eviction: entries compacted away; token i lives at entry i - dropped

    @property
    def last_hash(self) -> int | None:
        return self.hashes[-1] if self.hashes else None


@dataclass
class PrefixCacheStats:
    """Prefix-cache counters over prompt tokens looked up (queried) and found (hit)."""

    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


EVICTED = -1  # block-table entry of a block dropped by the StreamingLLM window or a sliding window

BlockKey = tuple[int | None, tuple[int, ...], int]  # a full block's (parent hash, its tokens, its chain hash)


def chain_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """Hash of a full block given the hash of the block before it (None for the first block)."""
    return hash((parent, tokens))


def prefix_keys(token_ids: list[int], block_size: int) -> list[BlockKey]:
    """The keys of the full blocks of token_ids that a prefix-cache hit may cover: all but the last token,
    whose logits are needed."""
    keys, parent = [], None
    for i in range((len(token_ids) - 1) // block_size):
        tokens = tuple(token_ids[i * block_size : (i + 1) * block_size])
        h = chain_hash(parent, tokens)
        keys.append((parent, tokens, h))
        parent = h
    return keys


class BlockManager:
    """Allocates fixed-size KV blocks to sequences, shares them by reference count.

    Slot s of a sequence (its s-th token) lives in block `table[s // block_size]` at offset
    `s % block_size`; `slot_ids` turns that into flat cache slot numbers.

    With `window_blocks` set (StreamingLLM), a sequence keeps at most that many blocks: its first
    `sink_blocks` (attention sinks) and the most recent ones; older blocks are dropped from its
    table (EVICTED) as it grows, so generation can run past the pool's per-sequence capacity.

    With `sliding_window` set (the pool of sliding-window layers, speclm/kv/hybrid.py), a sequence's
    blocks that lie wholly before the window of the first row it runs are dropped (EVICTED) when it
    asks for slots: no later row attends to them, so this is exact, unlike StreamingLLM. A sequence
    then holds at most its window plus its rows' blocks; a prefix-cache hit needs only the blocks
    under the window of the first row it computes.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        window_blocks: int | None = None,
        sink_blocks: int = 1,
        sliding_window: int | None = None,
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        if window_blocks is not None and not sink_blocks < window_blocks <= num_blocks:
            raise ValueError(
                f"the streaming window needs sink blocks ({sink_blocks}) < window blocks "
                f"({window_blocks}) <= pool blocks ({num_blocks})"
            )
        if sliding_window is not None and (sliding_window < 1 or window_blocks is not None):
            raise ValueError(f"a sliding window ({sliding_window}) must be >= 1 and not a streaming window too")
        self.window_blocks, self.sink_blocks = window_blocks, sink_blocks
        self.sliding_window = sliding_window
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._evictable: OrderedDict[int, None] = OrderedDict()  # ref 0 but cached; oldest first
        self._hash_to_block: dict[int, int] = {}
        self._block_key: dict[int, tuple[int | None, tuple[int, ...], int]] = {}  # block -> (parent, tokens, hash)
        self._seqs: dict[str, _SequenceBlocks] = {}
        self.stats = PrefixCacheStats()

    # -- public: queries -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks that can be handed out now (free, or cached but unreferenced)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one live sequence."""
        return self.num_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._hash_to_block)

    def has(self, seq_id: str) -> bool:
        return seq_id in self._seqs

    def block_table(self, seq_id: str) -> list[int]:
        return self._seqs[seq_id].blocks

    def slot_ids(self, seq_id: str, start: int, end: int) -> list[int]:
        """Flat cache slots (block * block_size + offset) of the sequence's tokens start..end-1. After a
        compaction (token-granular eviction) the kept entries come first, then tokens from the
        compaction on: start..end-1 are then entries start - dropped.. (from entry 0 at most)."""
        seq, bs = self._seqs[seq_id], self.block_size
        blocks, d = seq.blocks, seq.dropped
        lo, hi = max(0, start - d), end - d
        slots: list[int] = []
        for b in range(lo // bs, -(-hi // bs)):  # a block's run of slots at once (every step asks for them all)
            if blocks[b] != EVICTED:
                shift = (blocks[b] - b) * bs  # entry i of block b sits at slot blocks[b] * bs + i % bs
                slots.extend(range(max(lo, b * bs) + shift, min(hi, b * bs + bs) + shift))
        return slots

    def local_slot_ids(self, seq_id: str, start: int, end: int) -> None:
        """The slots of a separate pool of sliding-window layers (speclm/kv/hybrid.py): none here."""
        return None

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- public: lifecycle -----------------------------------------------------------------
    def allocate(self, seq_id: str, token_ids: list[int], reuse_prefix: bool = True) -> int:
        """Start a sequence: attach cached blocks holding a prefix of token_ids; return how many
        tokens they cover. At least the last prompt token is left to compute (its logits are needed).
        reuse_prefix=False computes every token (its blocks are still offered to later prompts)."""
        if not self.enable_prefix_caching or not reuse_prefix:
            self.attach(seq_id, [], 0)
            return 0
        keys = prefix_keys(token_ids, self.block_size)
        hit = self.longest_hit(keys, len(keys))
        self.attach(seq_id, keys, hit)
        self.stats.queried_tokens += len(token_ids)
        self.stats.hit_tokens += hit * self.block_size
        return hit * self.block_size

    def longest_hit(self, keys: list[BlockKey], limit: int) -> int:
        """The most leading blocks (at most `limit`) of a prompt with these block keys that this pool can
        serve from its prefix cache: all of them, or with a sliding window those under the window of the
        first row computed after them."""
        if self.sliding_window is None:
            n = 0
            while n < limit and self._cached(keys[n]) is not None:
                n += 1
            return n
        for n in range(limit, 0, -1):
            if all(self._cached(keys[i]) is not None for i in range(self._first_needed_block(n * self.block_size), n)):
                return n
        return 0

    def attach(self, seq_id: str, keys: list[BlockKey], num_blocks: int) -> None:
        """Start a sequence on the cached blocks of its first num_blocks keys (longest_hit said they are
        there; with a sliding window only those under the window are taken, the others are EVICTED)."""
        assert seq_id not in self._seqs, seq_id
        seq = _SequenceBlocks()
        self._seqs[seq_id] = seq
        first = self._first_needed_block(num_blocks * self.block_size) if self.sliding_window else 0
        for i, key in enumerate(keys[:num_blocks]):
            block = EVICTED if i < first else self._cached(key)
            assert block is not None, key
            if block != EVICTED:
                self._take(block)
            seq.blocks.append(block)
            seq.hashes.append(key[2])

    def ensure_slots(
        self, seq_id: str, write_from: int, end: int, first_row: int | None = None
    ) -> list[tuple[int, int]] | None:
        """Make slots write_from..end-1 writable: add blocks up to `end` tokens and copy any shared
        block in that range (copy-on-write). Returns the (src, dst) block copies the caller must do
        on the tensors, or None (changing nothing but a sliding window's drops) when there are not
        enough free blocks. `first_row` (default write_from): the first row the step runs for this
        sequence (drafts are written after it), whose window bounds what a sliding window keeps."""
        self.slide(seq_id, write_from if first_row is None else first_row)
        seq = self._seqs[seq_id]
        write_from, end = write_from - seq.dropped, end - seq.dropped
        new_blocks, shared = self._wanted(seq, write_from, end)
        if self.window_blocks is not None:
            self._slide_window(seq, write_from, new_blocks)
        if new_blocks + len(shared) > self.num_free_blocks:
            return None
        copies = []
        for i in shared:
            old, new = seq.blocks[i], self._pop_free()
            self.ref_counts[old] -= 1
            seq.blocks[i] = new
            copies.append((old, new))
            del seq.hashes[i:]  # a copied block is no longer the cached one
        seq.blocks.extend(self._pop_free() for _ in range(new_blocks))
        return copies

    def blocks_wanted(self, seq_id: str, write_from: int, end: int) -> int:
        """Free blocks ensure_slots(seq_id, write_from, end) would take (after `slide`)."""
        seq = self._seqs[seq_id]
        new_blocks, shared = self._wanted(seq, write_from - seq.dropped, end - seq.dropped)
        return new_blocks + len(shared)

    def slide(self, seq_id: str, first_row: int) -> None:
        """With a sliding window: release the sequence's blocks wholly before the window of position
        first_row (the first it will run; nothing before it is computed again but after a preemption,
        which starts over)."""
        if self.sliding_window is None:
            return
        seq = self._seqs[seq_id]
        for i in range(min(self._first_needed_block(first_row), len(seq.blocks))):
            if seq.blocks[i] != EVICTED:
                self._release(seq.blocks[i])
                seq.blocks[i] = EVICTED

    def compact(self, seq_id: str, num_held: int, num_kept: int) -> None:
        """Token-granular eviction: the sequence's first num_held entries become num_kept, which the
        caller writes to entries 0..num_kept-1 (the tensors move in PagedKVCache.compact). Blocks past
        them are released; shared blocks among them are replaced by private ones (their contents
        are rewritten whole, so nothing is copied). Raises RuntimeError when no block is free for that."""
        seq = self._seqs[seq_id]
        assert num_kept <= num_held and self.blocks_needed(num_held) <= len(seq.blocks), (num_held, len(seq.blocks))
        assert self.window_blocks is None and not self.enable_prefix_caching, "token eviction runs without these"
        keep = self.blocks_needed(num_kept)
        for block in reversed(seq.blocks[keep:]):
            self._release(block)
        del seq.blocks[keep:]
        shared = [i for i in range(keep) if self.ref_counts[seq.blocks[i]] > 1]
        if len(shared) > self.num_free_blocks:
            raise RuntimeError(f"no free KV block to compact the forked sequence {seq_id!r} into")
        for i in shared:
            self.ref_counts[seq.blocks[i]] -= 1
            seq.blocks[i] = self._pop_free()
        seq.dropped += num_held - num_kept

    def eviction_free_end(self, seq_id: str) -> int | None:
        """With a StreamingLLM window: how many positions the sequence can fill before allocating a
        block makes the window evict one (None without a window)."""
        if self.window_blocks is None:
            return None
        seq = self._seqs[seq_id]
        kept = sum(b != EVICTED for b in seq.blocks)
        return (len(seq.blocks) + self.window_blocks - kept) * self.block_size

    def mark_computed(self, seq_id: str, token_ids: list[int], num_computed: int) -> None:
        """Record that the first num_computed tokens (token_ids) are in the cache: full blocks among
        them become prefix-cache entries other prompts can reuse."""
        if not self.enable_prefix_caching:
            return
        seq, bs = self._seqs[seq_id], self.block_size
        while (len(seq.hashes) + 1) * bs <= num_computed:
            i = len(seq.hashes)
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(seq.last_hash, tokens)
            block = seq.blocks[i]
            if block != EVICTED and h not in self._hash_to_block and block not in self._block_key:
                self._hash_to_block[h] = block
                self._block_key[block] = (seq.last_hash, tokens, h)
            seq.hashes.append(h)

    def fork(self, parent_id: str, child_id: str) -> None:
        """Give child the parent's blocks (shared, copy-on-write on the next write)."""
        parent = self._seqs[parent_id]
        assert child_id not in self._seqs, child_id
        for block in parent.blocks:
            if block != EVICTED:
                self.ref_counts[block] += 1
        self._seqs[child_id] = _SequenceBlocks(list(parent.blocks), list(parent.hashes))

    def free(self, seq_id: str) -> None:
        """Release a finished, aborted or preempted sequence's blocks (cached ones stay reusable)."""
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return
        for block in reversed(seq.blocks):  # tail blocks first: they are evicted before the prefix
            if block != EVICTED:
                assert self.ref_counts[block] > 0, block
                self._release(block)

    # -- private ---------------------------------------------------------------------------
    def _first_needed_block(self, first_row: int) -> int:
        """With a sliding window: the first block that rows from position first_row on attend to."""
        return max(0, first_row - self.sliding_window + 1) // self.block_size

    def _cached(self, key: BlockKey) -> int | None:
        """The cached block holding this key's tokens, or None."""
        block = self._hash_to_block.get(key[2])
        return block if block is not None and self._block_key[block][:2] == key[:2] else None

    def _wanted(self, seq: _SequenceBlocks, write_from: int, end: int) -> tuple[int, list[int]]:
        """(blocks to add, indices of shared blocks to copy) for writing entries write_from..end-1."""
        bs, needed = self.block_size, self.blocks_needed(end)
        held = range(write_from // bs, min(len(seq.blocks), needed))
        shared = [i for i in held if self.ref_counts[seq.blocks[i]] > 1]
        return max(0, needed - len(seq.blocks)), shared

    def _slide_window(self, seq: _SequenceBlocks, write_from: int, new_blocks: int) -> None:
        """Drop the oldest non-sink blocks (never one being written) until the window has room."""
        kept = [i for i, b in enumerate(seq.blocks) if b != EVICTED]
        excess = len(kept) + new_blocks - self.window_blocks
        for i in kept:
            if excess <= 0 or i >= write_from // self.block_size:
                break
            if i < self.sink_blocks:
                continue
            self._release(seq.blocks[i])
            seq.blocks[i] = EVICTED
            excess -= 1

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if block in self._block_key:
                self._evictable[block] = None
            else:
                self._free.append(block)

    def _take(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self._evictable[block]
        self.ref_counts[block] += 1

    def _pop_free(self) -> int:
        if self._free:
            block = self._free.pop()
        else:
            block, _ = self._evictable.popitem(last=False)  # least recently freed
            _, _, h = self._block_key.pop(block)
            del self._hash_to_block[h]
        assert self.ref_counts[block] == 0, block
        self.ref_counts[block] = 1
        return block
