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
from speclm.models.layers import AttentionMetadata, DecodeRows, attend_like_decoding


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

    Every sequence attends on its own. Rows whose logits are checked against decoding (decode rows,
    verification rows, token-tree rows, a prompt's last token) attend like decoding
    (attend_like_decoding), reading their sequence's slots in order: the arithmetic of the
    single-request engine for that token, whatever else shares the step. A padded batch with a
    mask accumulates in another order, and with bf16 activations (int8/int4 weights) that flipped
    greedy near-ties, so speculative output in a batch drifted from plain batched decoding (SmolLM2
    int4: 2 of 10 Spec-Bench prompts). The other rows of a prompt chunk run one causal SDPA call.
    """

    def __init__(self, entries: list[BatchEntry], device: torch.device | str = "cpu") -> None:
        self.slot_mapping = torch.tensor(
            [s for e in entries for s in e.slots[len(e.slots) - len(e.tokens) :]], dtype=torch.long, device=device
        )  # [num_tokens]
        # Per sequence: (its rows attending like decoding, its slots, their DecodeRows over those slots).
        self.sequences: list[tuple[torch.Tensor, torch.Tensor, DecodeRows]] = []
        self.prompt_chunks: list[tuple[int, int, torch.Tensor]] = []  # (first row, rows, key slots) for SDPA
        offset = 0
        for e in entries:
            n, slots = len(e.tokens), torch.tensor(e.slots, dtype=torch.long, device=device)
            rows, local = torch.arange(offset, offset + n, device=device), None
            if e.row_paths is not None:  # token tree: each row over the prefix and its path
                local = DecodeRows.tree(len(e.slots) - n, e.row_paths, device)
            elif n == 1 or e.num_logits > 1:  # decoding, verification
                local = DecodeRows.causal(len(e.slots), n, device)
            else:  # a prompt chunk; its last token (when it completes the prompt) attends like decoding,
                # as the single-request engine runs it: as the first pending token after the prefill
                m = n - e.num_logits
                if m:
                    self.prompt_chunks.append((offset, m, slots[: len(slots) - e.num_logits]))
                if e.num_logits:
                    rows, local = rows[m:], DecodeRows(torch.tensor([len(e.slots)], device=device))
            if local is not None:
                self.sequences.append((rows, slots, local))
            offset += n
        self.num_tokens = offset
        self.pooled = self._pool_rows(device) if self.sequences else None

    def _pool_rows(self, device: torch.device | str) -> tuple[torch.Tensor, DecodeRows]:
        """All sequences' like-decoding rows as one DecodeRows over pool slots, with their row indices."""
        lengths = torch.cat([local.lengths for _, _, local in self.sequences])
        table = torch.zeros(len(lengths), int(lengths.max()), dtype=torch.long, device=device)
        r = 0
        for _, slots, local in self.sequences:
            for i, length in enumerate(local.lengths.tolist()):
                table[r, :length] = slots[:length] if local.slots is None else slots[local.slots[i, :length]]
                r += 1
        return torch.cat([rows for rows, _, _ in self.sequences]), DecodeRows(lengths, table)

    def attend(
        self,
        q: torch.Tensor,  # [heads, num_tokens, head_dim]
        k: torch.Tensor,  # [kv_heads, num_tokens, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [kv_heads, num_slots, head_dim], or Int8Slots
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """Write the new keys/values into their slots, then attend; returns [heads, num_tokens, head_dim]."""
        k_cache[:, self.slot_mapping] = k
        v_cache[:, self.slot_mapping] = v
        return self.attend_cached(q, k_cache, v_cache)

    def write_slots(self, device: torch.device) -> torch.Tensor:
        """The pool slot of each new token, [num_tokens] (rope_qkv writes keys/values there)."""
        return self.slot_mapping

    def attend_cached(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """attend, once the new keys/values are in the pool."""
        if isinstance(k_cache, torch.Tensor) and self.pooled is not None:  # one call reads the pool
            rows, pooled = self.pooled
            if len(rows) == self.num_tokens:  # a decode/verification-only step: rows are in order
                return attend_like_decoding(q, k_cache, v_cache, pooled)
            out = torch.empty_like(q)
            out[:, rows] = attend_like_decoding(q[:, rows], k_cache, v_cache, pooled)
        else:  # int8 slots: each sequence's keys are gathered and dequantized (a completing prompt
            # chunk's once more below for its other rows: once per prompt, not per decoded token)
            out = torch.empty_like(q)
            for rows, slots, local in self.sequences:
                out[:, rows] = attend_like_decoding(q[:, rows], k_cache[:, slots], v_cache[:, slots], local)
        gqa = q.shape[0] != k_cache.shape[0]
        for offset, m, slots in self.prompt_chunks:
            attn_mask, is_causal = AttentionMetadata(len(slots) - m, m).sdpa_mask()  # causal over its keys
            out[:, offset : offset + m] = F.scaled_dot_product_attention(
                q[:, offset : offset + m].unsqueeze(0), k_cache[:, slots].unsqueeze(0), v_cache[:, slots].unsqueeze(0),
                attn_mask=attn_mask, is_causal=is_causal, enable_gqa=gqa,
            )[0]
        return out
