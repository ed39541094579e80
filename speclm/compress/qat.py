"""Quantization-aware training for small models: fine-tune through fake-quantized weights with a
straight-through estimator, so the final round-to-nearest lands on weights trained for it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from tqdm import tqdm

from speclm.compress.calibration import LINEAR_NAMES
from speclm.compress.rtn import QuantScheme, rtn
from speclm.models.attention import AttentionMetadata
from speclm.models.llama import LlamaModel


class StraightThroughQuant(nn.Module):
    """Weight parametrization: the forward sees RTN(w), the gradient flows to w as if unquantized."""

    def __init__(self, scheme: QuantScheme) -> None:
        super().__init__()
        self.scheme = scheme

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w + (rtn(w.detach(), self.scheme).dequantize() - w).detach()


def training_loss(model: LlamaModel, window: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one window, with autograd (LlamaModel.forward runs in
    inference mode, so the layers are called directly here)."""
    n = window.numel()
    positions = torch.arange(n)
    x = model.embed_tokens(window)
    cos, sin = model.rotary(positions)
    cache = model.new_cache(n)
    for i, layer in enumerate(model.layers):
        k_cache, v_cache = cache.layer(i)
        x = layer(x, cos, sin, k_cache.clone(), v_cache.clone(), AttentionMetadata(0, n))
    logits = model.lm_head(model.norm(x[:-1]))  # [n-1, vocab]
    return F.cross_entropy(logits.float(), window[1:])


def quantization_aware_training(
    model: LlamaModel, windows: torch.Tensor, scheme: QuantScheme, steps: int = 50, lr: float = 1e-4, seed: int = 0
) -> list[float]:
    """Train the decoder Linear weights (only) through STE fake quantization for `steps` windows drawn
    from `windows` (seeded); returns the loss curve. The weights stay latent fp32: quantize after."""
    if steps < 1:
        raise ValueError(f"QAT steps must be positive, got {steps}")
    linears = [layer.get_submodule(name) for layer in model.layers for name in LINEAR_NAMES]
    for p in model.parameters():
        p.requires_grad_(False)
    for module in linears:
        module.weight.requires_grad_(True)
        parametrize.register_parametrization(module, "weight", StraightThroughQuant(scheme))
    params = [m.parametrizations.weight.original for m in linears]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    try:
        with torch.enable_grad():
            for _ in tqdm(range(steps), desc="qat", unit="step"):
                window = windows[int(torch.randint(len(windows), (1,), generator=generator))]
                loss = training_loss(model, window)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
    finally:
        for module in linears:
            parametrize.remove_parametrizations(module, "weight", leave_parametrized=False)
            module.weight.requires_grad_(False)
    return losses
