"""Paged KV-cache tensors and the attention metadata of a batched step that reads them through block tables.

The cache is one pool of slots per layer, [kv_heads, num_blocks * block_size, head_dim]; a sequence's
tokens are wherever its block table says (see BlockManager.slot_ids). A batched step flattens the new
tokens of all sequences through the linear layers at once (weights are read once per step, which is
where batching pays on a CPU) and attends per sequence by gathering its slots.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from speclm.kv.quantized import Int8Slots
from speclm.models.layers import AttentionMetadata, attend_like_decoding, attend_tree_like_decoding, tree_paths


class PagedKVCache:
    """Keys and values for all sequences: per layer [kv_heads, num_blocks * block_size, head_dim].

    With quantize=True they are stored as int8 with a per-(head, slot) scale (about 3.8x smaller
    than fp32 at head_dim 64) and dequantized to `dtype` when attention gathers them.
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
        self.keys = torch.zeros(shape, dtype=store, device=device)
        self.values = torch.zeros(shape, dtype=store, device=device)
        scale_shape = shape[:-1] + (1,)
        self.key_scales = torch.zeros(scale_shape, device=device) if quantize else None
        self.value_scales = torch.zeros(scale_shape, device=device) if quantize else None
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
            return (Int8Slots(self.keys[index], self.key_scales[index], self.dtype),
                    Int8Slots(self.values[index], self.value_scales[index], self.dtype))
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


@dataclass
class BatchEntry:
    """One sequence's part of a batched step: new tokens at positions start.., the cache slots of
    its tokens 0..start+len(tokens)-1 (minus any a StreamingLLM window dropped; the new tokens'
    slots are the last ones), and how many trailing rows need logits.

    `row_paths` marks a token-tree verification (speclm/spec/tree.py): tokens are the pending token
    then the tree's nodes, row r (written at the slot of position start + r) sits at position
    start + its depth and attends to the prefix and its path only (rows from 0 down to itself)."""

    tokens: list[int]
    start: int
    slots: list[int]
    num_logits: int
    row_paths: list[list[int]] | None = None

    def positions(self) -> list[int]:
        """The rotary position of every new token."""
        if self.row_paths is None:
            return list(range(self.start, self.start + len(self.tokens)))
        return [self.start + len(path) - 1 for path in self.row_paths]


class PagedAttentionMetadata:
    """Where a batched step's flattened tokens go in the paged cache and what each may attend to.

    Single-token (decode) sequences are attended together as one padded batch; sequences with
    several new tokens (prefill chunks, verification) one by one with a causal mask, or for a token
    tree with each row over the prefix and its path.
    """

    def __init__(self, entries: list[BatchEntry], device: torch.device | str = "cpu") -> None:
        self.slot_mapping = torch.tensor(
            [s for e in entries for s in e.slots[len(e.slots) - len(e.tokens) :]], dtype=torch.long, device=device
        )  # [num_tokens]
        offsets, self.multi = 0, []  # (query offset, entry) of multi-token entries
        single_rows, single_slots = [], []
        for e in entries:
            if len(e.tokens) == 1:
                single_rows.append(offsets)
                single_slots.append(e.slots)
            else:
                paths = None if e.row_paths is None else tree_paths(e.row_paths, device)
                self.multi.append((offsets, e, torch.tensor(e.slots, dtype=torch.long, device=device), paths))
            offsets += len(e.tokens)
        self.single_rows = torch.tensor(single_rows, dtype=torch.long, device=device)  # [num_single]
        self.single_slots, self.single_valid = None, None
        if single_slots:
            longest = max(len(s) for s in single_slots)
            self.single_slots = torch.tensor([s + [0] * (longest - len(s)) for s in single_slots], device=device)
            lengths = torch.tensor([len(s) for s in single_slots], device=device)
            # [num_single, 1, 1, longest]: True where a key slot belongs to the sequence
            self.single_valid = (torch.arange(longest, device=device) < lengths[:, None])[:, None, None, :]

    def attend(
        self,
        q: torch.Tensor,  # [heads, num_tokens, head_dim]
        k: torch.Tensor,  # [kv_heads, num_tokens, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [kv_heads, num_slots, head_dim]
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """Write the new keys/values into their slots, then attend; returns [heads, num_tokens, head_dim]."""
        k_cache[:, self.slot_mapping] = k
        v_cache[:, self.slot_mapping] = v
        gqa = q.shape[0] != k.shape[0]
        out = torch.empty_like(q)
        if self.single_slots is not None:
            keys = k_cache[:, self.single_slots].transpose(0, 1)  # [num_single, kv_heads, longest, head_dim]
            values = v_cache[:, self.single_slots].transpose(0, 1)
            queries = q[:, self.single_rows].transpose(0, 1).unsqueeze(2)  # [num_single, heads, 1, head_dim]
            single = F.scaled_dot_product_attention(queries, keys, values, attn_mask=self.single_valid, enable_gqa=gqa)
            out[:, self.single_rows] = single[:, :, 0].transpose(0, 1)
        for offset, e, slots, paths in self.multi:
            n = len(e.tokens)
            if paths is not None:  # tree rows, each like decoding once its path is committed
                # Gathered copies (dequantized for int8), so the path shuffling never touches the pool;
                # the new rows are read back from them like decoding reads its keys.
                keys, values = k_cache[:, slots], v_cache[:, slots]  # [kv_heads, len(slots), head_dim]
                start = keys.shape[1] - n
                out[:, offset : offset + n] = attend_tree_like_decoding(
                    q[:, offset : offset + n], keys[:, start:].clone(), values[:, start:].clone(), keys, values,
                    start, paths, gqa)
                continue
            if e.num_logits > 1:  # verification rows: computed exactly as decoding would
                out[:, offset : offset + n] = attend_like_decoding(
                    q[:, offset : offset + n], k_cache[:, slots], v_cache[:, slots], gqa
                )
                continue
            attn_mask, is_causal = AttentionMetadata(len(e.slots) - n, n).sdpa_mask()  # causal over kept keys
            out[:, offset : offset + n] = F.scaled_dot_product_attention(
                q[:, offset : offset + n].unsqueeze(0),
                k_cache[:, slots].unsqueeze(0),
                v_cache[:, slots].unsqueeze(0),
                attn_mask=attn_mask,
                is_causal=is_causal,
                enable_gqa=gqa,
            )[0]
        return out
