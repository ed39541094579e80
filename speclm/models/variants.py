"""The decoder layer of the families that differ from the llama block (qwen3, gemma3; see families.py):
q/k norms, the post-attention and post-MLP norms, GeGLU, and sliding-window attention on local layers. As in
layers.py, a module (training, calibration) and VariantOps, plain callables over the same tensors (inference).

The attention scale (gemma3's query_pre_attn_scalar) is folded into the q norm's weight when the model is
built (rotary is linear, so scaling q before it is scaling the scores), and gemma's (1 + weight) norms are
stored as 1 + weight: the norms here are speclm's plain RMSNorm.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from speclm.models.attention import TensorFn, self_attention
from speclm.models.config import ModelConfig
from speclm.models.layers import MLP, Attention, RMSNorm, rms_norm, swiglu
from speclm.models.linear import linear_op


def geglu(x: torch.Tensor, gate_up_proj: TensorFn, down_proj: TensorFn, intermediate_size: int) -> torch.Tensor:
    """GeGLU feed-forward (gemma): down(gelu_tanh(gate) * up), with a fused gate/up projection."""
    gate, up = gate_up_proj(x).split(intermediate_size, dim=-1)
    return down_proj(F.gelu(gate, approximate="tanh") * up)


def qk_norm(qkv: torch.Tensor, q_weight, k_weight, eps: float, heads: int, kv_heads: int, head_dim: int):
    """The QKV projection's output [n, (heads + 2 kv_heads) * head_dim] with each q and k head RMS-normed."""
    n = qkv.shape[0]
    q, k, v = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
    q = rms_norm(q.reshape(n * heads, head_dim), q_weight, eps).view(n, -1)
    k = rms_norm(k.reshape(n * kv_heads, head_dim), k_weight, eps).view(n, -1)
    if v.dtype != q.dtype:
        v = v.to(q.dtype)
    return torch.cat([q, k, v], dim=-1)


class VariantOps(NamedTuple):
    """One variant layer as plain callables (see layers.LayerOps)."""

    input_norm: TensorFn
    qkv_proj: TensorFn
    qk_norm: TensorFn | None
    o_proj: TensorFn
    post_attention_norm: TensorFn | None  # gemma3: the attention output's norm
    pre_mlp_norm: TensorFn
    post_mlp_norm: TensorFn | None
    gate_up_proj: TensorFn
    down_proj: TensorFn
    mlp: object  # swiglu or geglu
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    window: int | None


def variant_layer(x, k: VariantOps, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
    """x + [post_norm](attn(norm(x))), then x + [post_norm](mlp(norm(x)))."""
    qkv_proj = k.qkv_proj if k.qk_norm is None else (lambda h: k.qk_norm(k.qkv_proj(h)))
    attn = self_attention(
        k.input_norm(x), qkv_proj, k.o_proj, k.num_heads, k.num_kv_heads, k.head_dim, cos, sin, k_cache, v_cache, meta,
        window=k.window,
    )  # fmt: skip
    if k.post_attention_norm is not None:
        attn = k.post_attention_norm(attn)
    x = x + attn
    mlp = k.mlp(k.pre_mlp_norm(x), k.gate_up_proj, k.down_proj, k.intermediate_size)
    if k.post_mlp_norm is not None:
        mlp = k.post_mlp_norm(mlp)
    return x + mlp


class VariantDecoderLayer(nn.Module):
    """A decoder layer with the quirks its config switches on (variant_layer computes). The names of its
    modules are the Hugging Face ones: for gemma3, post_attention_layernorm is the attention output's norm
    and pre_feedforward_layernorm the MLP input's; for qwen3, post_attention_layernorm is the MLP input's."""

    native = False  # speclm/models/native_decoder.py runs the llama block only

    def __init__(self, config: ModelConfig, index: int) -> None:
        super().__init__()
        eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.self_attn = Attention(config)
        if config.qk_norm:
            self.self_attn.q_norm = RMSNorm(config.head_dim, eps)
            self.self_attn.k_norm = RMSNorm(config.head_dim, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.sandwich = config.sandwich_norms
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps)
        self.mlp = MLP(config)
        if config.hidden_act not in ("silu", "gelu_pytorch_tanh"):
            raise ValueError(f"unsupported activation {config.hidden_act!r} (supported: silu, gelu_pytorch_tanh)")
        self.gelu = config.hidden_act == "gelu_pytorch_tanh"
        self.window = config.sliding_window if config.is_local(index) else None
        self.local = self.window is not None

    def extra_norms(self) -> list[tuple[nn.Module, str]]:
        """(norm module, its name under the layer) for the norms the llama block does not have."""
        out = []
        if hasattr(self.self_attn, "q_norm"):
            out += [(self.self_attn.q_norm, "self_attn.q_norm"), (self.self_attn.k_norm, "self_attn.k_norm")]
        if self.sandwich:
            out += [(self.pre_feedforward_layernorm, "pre_feedforward_layernorm")]
            out += [(self.post_feedforward_layernorm, "post_feedforward_layernorm")]
        return out

    def ops(self, lean: bool = False) -> VariantOps:
        a, m = self.self_attn, self.mlp

        def f(module):
            if module is None or not lean:
                return module
            return module.op() if isinstance(module, RMSNorm) else linear_op(module)

        norm = None
        if hasattr(a, "q_norm"):
            q_norm, k_norm = a.q_norm, a.k_norm
            norm = functools.partial(
                qk_norm, q_weight=q_norm.weight, k_weight=k_norm.weight, eps=q_norm.eps,
                heads=a.num_heads, kv_heads=a.num_kv_heads, head_dim=a.head_dim,
            )  # fmt: skip
        if self.sandwich:
            post_attn, pre_mlp, post_mlp = (
                self.post_attention_layernorm,
                self.pre_feedforward_layernorm,
                self.post_feedforward_layernorm,
            )
        else:
            post_attn, pre_mlp, post_mlp = None, self.post_attention_layernorm, None
        return VariantOps(
            f(self.input_layernorm), f(a.qkv_proj), norm, f(a.o_proj), f(post_attn), f(pre_mlp), f(post_mlp),
            f(m.gate_up_proj), f(m.down_proj), geglu if self.gelu else swiglu,
            a.num_heads, a.num_kv_heads, a.head_dim, m.intermediate_size, self.window,
        )  # fmt: skip

    def forward(self, x, cos, sin, k_cache, v_cache, meta) -> torch.Tensor:
        return variant_layer(x, self.ops(), cos, sin, k_cache, v_cache, meta)


def make_layers(config: ModelConfig) -> nn.ModuleList:
    return nn.ModuleList(VariantDecoderLayer(config, i) for i in range(config.num_layers))
