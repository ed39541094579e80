"""Attention metadata over fixed buffers: a step whose rows all attend like decoding (decode, verification
chains, token trees), read from tensors whose addresses never change, so a CUDA graph can replay the
pass (speclm/engine/decode_graphs.py fills the buffers and captures it)."""

from __future__ import annotations

import torch

from speclm.models.attention import DecodeRows, attend_like_decoding
from speclm.models.gpu_attention import attend_decode_rows


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
        self.local = None  # (sliding-window layers with a pool of their own run their steps eagerly)
        self._windowed: dict[int, DecodeRows] = {}

    def write_slots(self, device: torch.device) -> torch.Tensor:
        return self.slot_mapping

    def attend_cached(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, window: int | None = None
    ) -> torch.Tensor:
        """Every row q [heads, rows, head_dim] over its table row, as plain decoding attends it; with `window`,
        over the last `window` keys of it (a sliding-window layer)."""
        if window is None:
            return attend_like_decoding(q, k_cache, v_cache, self.rows)
        if q.is_cuda:  # the kernel reads each row's last `window` keys itself
            rows = self.rows
            return attend_decode_rows(q, k_cache, v_cache, rows.lengths, rows.slots, rows.slot_rows, window)
        if window not in self._windowed:  # (the CPU: explicit windowed slot rows)
            self._windowed[window] = self.rows.windowed(window)
        return attend_like_decoding(q, k_cache, v_cache, self._windowed[window])
