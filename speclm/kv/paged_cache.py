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

    Every sequence attends on its own. A decode row makes the very call the single-request engine
    makes for that token (one query, unmasked, over the sequence's keys): a padded batch with a mask
    accumulates in another order, and with bf16 activations (int8/int4 weights) that flipped greedy
    near-ties, so speculative output in a batch drifted from plain batched decoding (SmolLM2 int4:
    2 of 10 Spec-Bench prompts). Sequences with several new tokens: prefill chunks with a causal
    mask (a prompt's last token like a decode row), verification rows each like decoding, token
    trees each row over the prefix and its path.
    """

    def __init__(self, entries: list[BatchEntry], device: torch.device | str = "cpu") -> None:
        self.slot_mapping = torch.tensor(
            [s for e in entries for s in e.slots[len(e.slots) - len(e.tokens) :]], dtype=torch.long, device=device
        )  # [num_tokens]
        offsets = 0
        self.single: list[tuple[int, torch.Tensor]] = []  # (query row, key slots) of decode rows
        self.multi = []  # (query offset, entry, key slots, tree paths) of multi-token entries
        for e in entries:
            slots = torch.tensor(e.slots, dtype=torch.long, device=device)
            if len(e.tokens) == 1:
                self.single.append((offsets, slots))
            else:
                paths = None if e.row_paths is None else tree_paths(e.row_paths, device)
                self.multi.append((offsets, e, slots, paths))
            offsets += len(e.tokens)

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
        for row, slots in self.single:  # decode rows: the single-request engine's call
            out[:, row : row + 1] = F.scaled_dot_product_attention(
                q[None, :, row : row + 1], k_cache[:, slots].unsqueeze(0), v_cache[:, slots].unsqueeze(0),
                enable_gqa=gqa)[0]
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
            # A prompt chunk. The prompt's last token, whose logits pick the first output token, attends
            # like a decode row: the single-request engine prefills all but that token and runs it as
            # the first pending token, so a prompt prefilled in one chunk gives both engines one output.
            m = n - e.num_logits
            keys, values = k_cache[:, slots], v_cache[:, slots]  # [kv_heads, len(slots), head_dim], gathered once
            if e.num_logits:
                row = offset + m
                out[:, row : row + 1] = F.scaled_dot_product_attention(
                    q[None, :, row : row + 1], keys[None], values[None], enable_gqa=gqa)[0]
            if m:
                kept = len(slots) - e.num_logits
                attn_mask, is_causal = AttentionMetadata(kept - m, m).sdpa_mask()  # causal over kept keys
                out[:, offset : offset + m] = F.scaled_dot_product_attention(
                    q[:, offset : offset + m].unsqueeze(0),
                    keys[None, :, :kept],
                    values[None, :, :kept],
                    attn_mask=attn_mask,
                    is_causal=is_causal,
                    enable_gqa=gqa,
                )[0]
        return out
