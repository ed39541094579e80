"""AWQ (Lin et al. 2023): per-input-channel scales that protect salient weights, searched on
calibration activations and folded into the preceding op, then round-to-nearest quantization."""

from __future__ import annotations

import torch

from speclm.compress.rtn import QuantScheme, rtn


def output_mse(delta: torch.Tensor, gram: torch.Tensor, tokens: int) -> float:
    """mean((x delta^T)^2) over tokens and outputs, from the Gram matrix x^T x [in, in] instead of
    the activations: ||x d^T||^2 = sum((d G) * d). Cheaper when tokens > in (7x for SmolLM2's qkv)."""
    return ((delta @ gram) * delta).sum().item() / (tokens * delta.shape[0])


def search_scale(x: torch.Tensor, w: torch.Tensor, scheme: QuantScheme, grid: int = 20) -> torch.Tensor:
    """Scales s [in] = mean|x|^alpha (alpha on a grid in [0, 1)) minimising ||x W^T - x (Q(W s)/s)^T||^2."""
    x = x.float()
    gram = x.T @ x  # [in, in]
    x_mean = x.abs().mean(dim=0)
    best, best_scale = float("inf"), torch.ones_like(x_mean)
    for step in range(grid):
        s = x_mean.pow(step / grid).clamp(min=1e-4)
        s = s / (s.max() * s.min()).sqrt()
        w_hat = rtn(w * s, scheme).dequantize() / s
        loss = output_mse(w_hat - w, gram, x.shape[0])
        if loss < best:
            best, best_scale = loss, s
    return best_scale


def subsample(x: torch.Tensor, max_tokens: int) -> torch.Tensor:
    """Evenly strided rows of x, at most max_tokens (the search needs only the activation statistics)."""
    stride = max(1, x.shape[0] // max_tokens)
    return x[::stride][:max_tokens]


@torch.no_grad()
def awq_scale_layer(layer, inputs: dict[str, torch.Tensor], scheme: QuantScheme, max_tokens: int = 4096) -> None:
    """Search and fold AWQ scales for one decoder layer in place (outputs unchanged in fp32):
    input_layernorm -> qkv_proj, post_attention_layernorm -> gate_up_proj, up rows -> down_proj,
    and v rows -> o_proj when there is no GQA (with GQA a v row feeds several o_proj columns)."""
    attn, mlp = layer.self_attn, layer.mlp
    s = search_scale(subsample(inputs["self_attn.qkv_proj"], max_tokens), attn.qkv_proj.weight, scheme)
    layer.input_layernorm.weight.div_(s)
    attn.qkv_proj.weight.mul_(s)
    s = search_scale(subsample(inputs["mlp.gate_up_proj"], max_tokens), mlp.gate_up_proj.weight, scheme)
    layer.post_attention_layernorm.weight.div_(s)
    mlp.gate_up_proj.weight.mul_(s)
    s = search_scale(subsample(inputs["mlp.down_proj"], max_tokens), mlp.down_proj.weight, scheme)
    mlp.gate_up_proj.weight[mlp.intermediate_size :].div_(s.unsqueeze(1))
    mlp.down_proj.weight.mul_(s)
    if attn.num_heads == attn.num_kv_heads:
        s = search_scale(subsample(inputs["self_attn.o_proj"], max_tokens), attn.o_proj.weight, scheme)
        v_rows = slice(sum(attn.split_sizes[:2]), None)
        attn.qkv_proj.weight[v_rows].div_(s.unsqueeze(1))
        if attn.qkv_proj.bias is not None:
            attn.qkv_proj.bias[v_rows].div_(s)
        attn.o_proj.weight.mul_(s)
