"""SmoothQuant (Xiao et al. 2022): migrate activation outliers into the weights with per-channel
scales s = max|X|^alpha / max|W|^(1-alpha), folded into the RMSNorms, so W8A8 loses little."""

from __future__ import annotations

import torch
from torch import nn


def smooth_scale(x_absmax: torch.Tensor, w: torch.Tensor, alpha: float) -> torch.Tensor:
    """Scales s [in] for activations with per-channel max |x| [in] feeding weight w [out, in]."""
    w_absmax = w.abs().amax(dim=0).clamp(min=1e-5)
    return (x_absmax.clamp(min=1e-5).pow(alpha) / w_absmax.pow(1 - alpha)).clamp(min=1e-5)


@torch.no_grad()
def smooth_layer(layer, inputs: dict[str, torch.Tensor], alpha: float = 0.5) -> None:
    """Fold smoothing scales into input_layernorm/qkv_proj and post_attention_layernorm/gate_up_proj."""
    pairs = [
        (layer.input_layernorm, layer.self_attn.qkv_proj, "self_attn.qkv_proj"),
        (layer.post_attention_layernorm, layer.mlp.gate_up_proj, "mlp.gate_up_proj"),
    ]
    for norm, linear, name in pairs:
        s = smooth_scale(inputs[name].abs().amax(dim=0), linear.weight, alpha)
        norm.weight.div_(s)
        linear.weight.mul_(s)


def fake_quantize_per_token(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Symmetric dynamic per-token (per-row) fake quantization of activations x [tokens, in]."""
    qmax = 2 ** (bits - 1) - 1
    scale = (x.abs().amax(dim=-1, keepdim=True) / qmax).clamp(min=1e-8)
    return torch.clamp(torch.round(x / scale), -qmax, qmax) * scale


def apply_activation_quant(model: nn.Module, bits: int) -> None:
    """Simulate A{bits} on every decoder Linear input (what an int8 GEMM runtime would compute)."""
    for layer in model.layers:
        for module in layer.modules():
            if isinstance(module, nn.Linear):
                module.register_forward_pre_hook(lambda _m, args: (fake_quantize_per_token(args[0], bits),))
