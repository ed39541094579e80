"""int8 KV-cache calibration: a static scale per layer and KV head from calibration activations."""

from __future__ import annotations

import torch

from speclm.compress.calibration import LayerwiseCalibration
from speclm.models.llama import LlamaModel


@torch.no_grad()
def calibrate_kv_scales(model: LlamaModel, windows: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 scales [layers, 2 (key, value), kv_heads] = max |K| or |V| / 127 on the windows
    (keys after RoPE, as the cache stores them). Run on the model the engine will serve (after
    weight quantization) so the scales match its activations."""
    calib = LayerwiseCalibration(model, windows)
    scales = [calib.kv_absmax(layer) / 127 for _, layer in calib.layers("kv-cache int8")]
    return torch.stack(scales).clamp(min=1e-8)


def kv_scale_tensors(scales: torch.Tensor) -> dict[str, torch.Tensor]:
    """Checkpoint tensors model.layers.N.self_attn.{k,v}_scale ([kv_heads] fp32 each)."""
    out = {}
    for i, layer_scales in enumerate(scales):
        out[f"model.layers.{i}.self_attn.k_scale"] = layer_scales[0].contiguous()
        out[f"model.layers.{i}.self_attn.v_scale"] = layer_scales[1].contiguous()
    return out


def fake_quantize_kv(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 round trip of cache entries x [kv_heads, tokens, head_dim] with per-head scales [kv_heads]."""
    s = scale.view(-1, 1, 1)
    return torch.clamp(torch.round(x / s), -127, 127) * s
