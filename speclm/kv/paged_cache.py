"""Paged KV-cache tensors: one pool of slots per layer, [kv_heads, num_blocks * block_size, head_dim].

Storage only: a sequence's tokens are wherever its block table says (BlockManager.slot_ids), and
attention over them lives in speclm/models/attention.py (PagedAttentionMetadata).
"""

from __future__ import annotations

import torch

from speclm.kv.quantized import Int8Slots


class PagedKVCache:
    """Keys and values for all sequences: per layer [kv_heads, num_blocks * block_size, head_dim].

    With quantize=True they are stored as int8 with a per-(head, slot) scale (about 3.8x smaller
    than fp32 at head_dim 64) and dequantized to `dtype` when attention gathers them. The pool is
    allocated uninitialized: pages the operating system has not handed out cost no memory until a
    block is first written, so a large pool is cheap while it is mostly free.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        quantize: bool = False,
    ) -> None:
        shape = (num_layers, num_kv_heads, num_blocks * block_size, head_dim)
        store = torch.int8 if quantize else dtype
        self.keys = torch.empty(shape, dtype=store, device=device)
        self.values = torch.empty(shape, dtype=store, device=device)
        scale_shape = shape[:-1] + (1,)
        self.key_scales = torch.empty(scale_shape, device=device) if quantize else None
        self.value_scales = torch.empty(scale_shape, device=device) if quantize else None
        self.dtype, self.quantize = dtype, quantize
        self.num_blocks = num_blocks
        self.block_size = block_size

    @property
    def nbytes(self) -> int:
        scales = self.key_scales.nbytes + self.value_scales.nbytes if self.quantize else 0
        return self.keys.nbytes + self.values.nbytes + scales

    def layer(self, index: int):
        """(keys, values) of one layer: tensors, or Int8Slots that index like them."""
        if self.quantize:
            return (
                Int8Slots(self.keys[index], self.key_scales[index], self.dtype),
                Int8Slots(self.values[index], self.value_scales[index], self.dtype),
            )
        return self.keys[index], self.values[index]

    def _tensors(self) -> list[torch.Tensor]:
        return [self.keys, self.values] + ([self.key_scales, self.value_scales] if self.quantize else [])

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Copy whole blocks src -> dst in every layer (copy-on-write of shared blocks)."""
        bs = self.block_size
        for src, dst in copies:
            for t in self._tensors():
                t[:, :, dst * bs : (dst + 1) * bs] = t[:, :, src * bs : (src + 1) * bs]

    def move_slots(self, src: list[int], dst: list[int]) -> None:
        """Copy the entries of slots src to slots dst in every layer (a verified token tree's
        accepted path moves right after its root; the sources are read before any is written)."""
        if not src:
            return
        src_index = torch.tensor(src, device=self.keys.device)
        dst_index = torch.tensor(dst, device=self.keys.device)
        for t in self._tensors():
            t[:, :, dst_index] = t[:, :, src_index]

    def gather_keys(self, slots: list[int]) -> torch.Tensor:
        """The keys at `slots` in every layer, [layers, kv_heads, len(slots), head_dim] in self.dtype. Slots
        that run through whole blocks from a block's start (a sequence's entries) are read a block at a
        time, about 4x faster than slot by slot."""
        bs, device = self.block_size, self.keys.device
        index = torch.tensor(slots, device=device)
        if self.quantize:
            return torch.stack([self.layer(i)[0][:, index] for i in range(self.keys.shape[0])])
        blocks = index[::bs] // bs
        n = len(slots)
        if not torch.equal((blocks[:, None] * bs + torch.arange(bs, device=device)).reshape(-1)[:n], index):
            return self.keys[:, :, index]
        layers, heads, _, head_dim = self.keys.shape
        by_block = self.keys.view(layers, heads, self.num_blocks, bs * head_dim).index_select(2, blocks)
        return by_block.view(layers, heads, -1, head_dim)[:, :, :n]

    def compact(self, src: list[int], kept: torch.Tensor, dst: list[int]) -> None:
        """Token-granular eviction of one sequence whose entries sit at slots `src`: per layer and KV
        head, entry kept[layer, head, j] moves to slot dst[j]. kept is [layers, kv_heads, len(dst)]
        int64; each (layer, head) keeps its own entries. Sources are read before any is written."""
        device = self.keys.device
        src_index = torch.tensor(src, device=device)
        dst_index = torch.tensor(dst, device=device)
        kept = kept.to(device)
        for t in self._tensors():
            entries = t[:, :, src_index]  # [layers, kv_heads, len(src), head_dim (1 for scales)]
            t[:, :, dst_index] = entries.gather(2, kept[..., None].expand(-1, -1, -1, t.shape[-1]))
