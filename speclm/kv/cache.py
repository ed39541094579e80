"""A preallocated per-sequence KV cache that can roll back rejected speculative positions."""

from __future__ import annotations

import torch


class KVCache:
    """Keys and values for one sequence: per layer [kv_heads, capacity, head_dim].

    `length` counts the slots that hold committed tokens; a forward pass may write past it
    (speculative tokens), and `truncate` forgets those slots again.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.keys[index], self.values[index]

    def truncate(self, length: int) -> None:
        """Keep the first `length` slots (drop rejected speculative tokens)."""
        assert 0 <= length <= self.capacity, (length, self.capacity)
        self.length = length
