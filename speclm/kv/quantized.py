"""int8 KV-cache storage: one fp32 scale per (kv head, slot), dequantized on read."""

from __future__ import annotations

import torch


class Int8Slots:
    """One layer's keys (or values) kept as int8 with a symmetric absmax scale per (head, slot).

    Indexed like the float tensor [kv_heads, num_slots, head_dim] it stands for, so the paged
    attention code needs no change: `slots[:, idx] = x` quantizes, `slots[:, idx]` dequantizes.
    """

    def __init__(self, data: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> None:
        self.data = data  # [kv_heads, num_slots, head_dim] int8
        self.scale = scale  # [kv_heads, num_slots, 1] fp32
        self.dtype = dtype

    @property
    def shape(self) -> torch.Size:
        return self.data.shape

    def __getitem__(self, index) -> torch.Tensor:
        return (self.data[index].to(torch.float32) * self.scale[index]).to(self.dtype)

    def __setitem__(self, index, x: torch.Tensor) -> None:
        x = x.float()
        scale = x.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 127.0  # [..., 1]
        self.data[index] = torch.round(x / scale).clamp(-127, 127).to(torch.int8)
        self.scale[index] = scale


def int8_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int) -> int:
    """Keys + values of one token in the int8 cache: head_dim bytes and a 4-byte scale per head."""
    return 2 * num_layers * num_kv_heads * (head_dim + 4)
