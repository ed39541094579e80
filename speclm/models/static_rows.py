"""Attention metadata over fixed buffers: a step whose rows all attend like decoding (decode, verification
chains, token trees), read from tensors whose addresses never change, so a CUDA graph can replay the
pass (speclm/engine/decode_graphs.py fills the buffers and captures it)."""

from __future__ import annotations

import torch

from speclm.models.attention import DecodeRows, attend_like_decoding


class StaticRowsMetadata:
    """PagedAttentionMetadata's interface over fixed tensors: row i writes its key and value at
    write_slots[i] and attends to the pool slots table[table_rows[i], :lengths[i]] (DecodeRows' meaning).
    Nothing is read back to the host; padded rows write a scratch slot and read only it."""

    queries = None  # (steps that want the layers' queries run the eager path)

    def __init__(
        self,
        write_slots: torch.Tensor,  # [rows] int64
        lengths: torch.Tensor,  # [rows] int64
        table: torch.Tensor,  # [table rows, width] int64 pool slots
        table_rows: torch.Tensor,  # [rows] int64
        max_position: int,
    ) -> None:
        self.slot_mapping = write_slots
        self.rows = DecodeRows(lengths, table, table_rows)
        self.num_tokens = len(write_slots)
        self.max_position = max_position  # the rotary tables already cover it (LlamaModel.reserve_positions)

    def write_slots(self, device: torch.device) -> torch.Tensor:
        return self.slot_mapping

    def attend_cached(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int | None = None
    ) -> torch.Tensor:
        """Every row q [heads, rows, head_dim] over its table row, as plain decoding attends it."""
        if window is not None:
            raise ValueError("sliding-window layers do not run from static rows (DecodeGraphs refuses such models)")
        return attend_like_decoding(q, k_cache, v_cache, self.rows)
