"""Integer weight quantization schemes and round-to-nearest (RTN), per channel or group-wise.

Every scheme stores unsigned integers q in [0, 2^bits - 1] with a scale and zero point per
(output row, input group): w ~ (q - zero) * scale. Symmetric schemes fix zero = 2^(bits-1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from speclm.models.qformat import QuantScheme, dequantize, expand

__all__ = ["Fit", "QuantScheme", "QuantizedWeight", "dequantize", "expand", "find_params", "group_params", "rtn"]

# How a group's scale and zero [rows] are fitted to its columns w [rows, cols].
Fit = Callable[[torch.Tensor, QuantScheme], tuple[torch.Tensor, torch.Tensor]]


def find_params(w: torch.Tensor, scheme: QuantScheme) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero [rows] for columns w [rows, cols] that share one group (min/max fit)."""
    if scheme.sym:
        absmax = w.abs().amax(dim=1).clamp(min=1e-8)
        half = 2 ** (scheme.bits - 1)
        return absmax / (half - 1), torch.full_like(absmax, float(half))
    lo = w.amin(dim=1).clamp(max=0)  # keep 0 exactly representable (zero padding, pruned weights)
    hi = w.amax(dim=1).clamp(min=0)
    scale = ((hi - lo) / scheme.maxq).clamp(min=1e-8)
    return scale, torch.round(-lo / scale).clamp(0, scheme.maxq)


def group_params(w: torch.Tensor, scheme: QuantScheme, fit: Fit = find_params) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero [rows, num_groups] fitted to every group of w [rows, cols]."""
    width = scheme.group_width(w.shape[1])
    params = [fit(w[:, g : g + width], scheme) for g in range(0, w.shape[1], width)]
    return torch.stack([s for s, _ in params], dim=1), torch.stack([z for _, z in params], dim=1)


def quantize_to_int(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """Integers q [rows, cols] (uint8) for w with the given per-group params."""
    s, z = expand(scale, w.shape[1], scheme), expand(zero, w.shape[1], scheme)
    return torch.clamp(torch.round(w / s) + z, 0, scheme.maxq).to(torch.uint8)


def quantize_column(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """Fake-quantize one column w [rows] with per-row scale and zero (used inside GPTQ's loop)."""
    q = torch.clamp(torch.round(w / scale) + zero, 0, maxq)
    return (q - zero) * scale


@dataclass
class QuantizedWeight:
    """The integer form of one Linear weight: q [rows, cols] uint8, scale/zero [rows, groups]."""

    q: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    scheme: QuantScheme

    def dequantize(self) -> torch.Tensor:
        return dequantize(self.q, self.scale, self.zero, self.scheme)


def rtn(w: torch.Tensor, scheme: QuantScheme) -> QuantizedWeight:
    """Round-to-nearest: fit min/max params per group, then round every weight independently."""
    scale, zero = group_params(w.float(), scheme)
    return QuantizedWeight(quantize_to_int(w.float(), scale, zero, scheme), scale, zero, scheme)


def from_fake_quant(
    w_hat: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, scheme: QuantScheme
) -> QuantizedWeight:
    """Integers for weights already on the grid (GPTQ's output): rounding recovers q exactly."""
    return QuantizedWeight(quantize_to_int(w_hat, scale, zero, scheme), scale, zero, scheme)
