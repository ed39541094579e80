"""Writing quantized weights in speclm's stored format (speclm/models/qformat.py describes and reads it)."""

from __future__ import annotations

import torch

from speclm.compress.rtn import QuantizedWeight
from speclm.models.qformat import FP8_DTYPES, pack


def int_tensors(prefix: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """The stored tensors of one integer-quantized Linear weight."""
    return {
        f"{prefix}.qweight": pack(qw.q, qw.scheme.bits),
        f"{prefix}.scales": qw.scale.float().contiguous(),
        f"{prefix}.qzeros": qw.zero.to(torch.uint8).contiguous(),
    }


def fp8_quantize(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row scaled FP8 weights: (w8 [rows, cols] float8, scale [rows, 1]); w ~ w8.float() * scale."""
    dtype = FP8_DTYPES[fmt]
    scale = (w.abs().amax(dim=1, keepdim=True) / torch.finfo(dtype).max).clamp(min=1e-12)
    return (w / scale).to(dtype), scale.float()
