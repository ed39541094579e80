"""The llama-family decoder layer: RMSNorm, SwiGLU MLP and the layer itself, as nn.Modules (which
training and calibration see) and as LayerOps, plain callables over the same tensors (inference)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from speclm.models.attention import AttentionMetadata, PagedAttentionMetadata, TensorFn, decode_kernels, self_attention
from speclm.models.config import ModelConfig
from speclm.models.linear import Linear, linear_op

_NORM_KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # weight dtypes speclm's rms_norm kernel takes


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square layer norm, computed in fp32 like the reference implementations; the result
    has the weight's dtype (bf16 weights give the bf16 activations the quantized formats compute in,
    without a separate cast). On the CPU, without gradients, speclm's kernel computes the same
    (one call instead of six ops); on a GPU a Triton kernel does (one launch, rows independent of each other)."""
    if x.is_cuda and x.dim() == 2 and x.stride(-1) == 1:
        if not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
            from speclm.kernels.triton_ops import rms_norm as gpu_rms_norm

            return gpu_rms_norm(x, weight, eps)
    if x.dtype != torch.float32:  # checked in Python: a no-op .float() still costs a dispatch
        x = x.float()
    fits = x.dim() == 2 and x.stride(-1) == 1 and weight.dtype in _NORM_KERNEL_DTYPES
    kernels = decode_kernels(x) if fits else None
    if kernels is not None and not (weight.requires_grad and torch.is_grad_enabled()):
        return kernels.rms_norm(x, weight, eps)
    x = torch.rms_norm(x, x.shape[-1:], eps=eps)  # same arithmetic as x * rsqrt(mean(x^2) + eps)
    return weight * (x if weight.dtype == torch.float32 else x.to(weight.dtype))


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (rms_norm) with a learned per-channel weight."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def op(self) -> NormOp:
        """forward as a callable over this norm's weight (see LayerOps)."""
        return NormOp(self.weight, self.eps)


class NormOp:
    """RMSNorm's lean op: rms_norm over one weight, without the module (add_norm reads weight and eps)."""

    __slots__ = ("weight", "eps")

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight, self.eps = weight, eps

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def add_norm(x: torch.Tensor, delta: torch.Tensor, norm: RMSNorm | NormOp | None):
    """(x + delta, norm(x + delta)): the residual stream's add and the norm after it (None: no norm). On a GPU,
    without gradients, one Triton launch computes both, bit for bit what the two ops give."""
    if norm is not None and x.is_cuda and x.dim() == 2 and x.stride(-1) == 1 and delta.stride(-1) == 1:
        if not (torch.is_grad_enabled() and (x.requires_grad or delta.requires_grad or norm.weight.requires_grad)):
            from speclm.kernels.triton_ops import add_rms_norm

            return add_rms_norm(x, delta, norm.weight, norm.eps)
    x = x + delta
    return x, None if norm is None else norm(x)


def swiglu(x: torch.Tensor, gate_up_proj: TensorFn, down_proj: TensorFn, intermediate_size: int) -> torch.Tensor:
    """SwiGLU feed-forward with a fused gate/up projection (silu and product in one kernel call for
    bf16 and fp32 activations on the CPU, and on a GPU without gradients)."""
    gate_up = gate_up_proj(x)
    if gate_up.is_cuda and gate_up.dim() == 2 and gate_up.stride(-1) == 1 and not gate_up.requires_grad:
        from speclm.kernels.triton_ops import silu_mul

        return down_proj(silu_mul(gate_up))
    fits = gate_up.dim() == 2 and gate_up.stride(-1) == 1 and gate_up.dtype in (torch.bfloat16, torch.float32)
    kernels = decode_kernels(gate_up, gate_up.dtype) if fits else None
    if kernels is not None:
        return down_proj(kernels.silu_mul(gate_up))
    gate, up = gate_up.split(intermediate_size, dim=-1)
    return down_proj(F.silu(gate) * up)


class LayerOps(NamedTuple):
    """One decoder layer as plain callables: its modules, or (lean) closures over their tensors.

    Lean ops compute exactly what the modules compute, without nn.Module dispatch and attribute
    lookups on the decode path. They do not see modules replaced or hooked after they were made
    (LlamaModel.use_lean_ops).
    """

    input_norm: TensorFn
    qkv_proj: TensorFn
    o_proj: TensorFn
    post_attention_norm: TensorFn
    gate_up_proj: TensorFn
    down_proj: TensorFn
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int


def decoder_layer(
    x, k: LayerOps, cos, sin, k_cache, v_cache, meta: AttentionMetadata | PagedAttentionMetadata
) -> torch.Tensor:
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""
    return residual_layer(x, k.input_norm(x), k, None, cos, sin, k_cache, v_cache, meta)[0]


def residual_layer(
    x, normed, k: LayerOps, next_norm, cos, sin, k_cache, v_cache, meta: AttentionMetadata | PagedAttentionMetadata
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """decoder_layer from x and its input norm `normed`: (the layer's output, next_norm of it: the next
    layer's input norm, or the final norm). Each residual add runs with the norm after it (add_norm)."""
    attn = self_attention(
        normed, k.qkv_proj, k.o_proj, k.num_heads, k.num_kv_heads, k.head_dim, cos, sin, k_cache, v_cache, meta
    )
    x, normed = add_norm(x, attn, k.post_attention_norm)
    return add_norm(x, swiglu(normed, k.gate_up_proj, k.down_proj, k.intermediate_size), next_norm)


class Attention(nn.Module):
    """Holds the attention projections (self_attention computes)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        q_size = config.num_heads * config.head_dim
        kv_size = config.num_kv_heads * config.head_dim
        self.split_sizes = [q_size, kv_size, kv_size]
        self.qkv_proj = Linear(config.hidden_size, q_size + 2 * kv_size, bias=config.attention_bias)
        self.o_proj = Linear(q_size, config.hidden_size, bias=config.attention_output_bias)

    def forward(self, x, cos, sin, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        return self_attention(
            x,
            self.qkv_proj,
            self.o_proj,
            self.num_heads,
            self.num_kv_heads,
            self.head_dim,
            cos,
            sin,
            k_cache,
            v_cache,
            meta,
        )


class MLP(nn.Module):
    """Holds the SwiGLU projections (swiglu computes)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.intermediate_size = config.intermediate_size
        self.gate_up_proj = Linear(config.hidden_size, 2 * config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return swiglu(x, self.gate_up_proj, self.down_proj, self.intermediate_size)


class DecoderLayer(nn.Module):
    """Pre-norm transformer block (decoder_layer computes)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)

    def ops(self, lean: bool = False) -> LayerOps:
        """This layer's callables: its modules, or with lean=True closures over their tensors."""
        a, m = self.self_attn, self.mlp
        modules = (
            self.input_layernorm,
            a.qkv_proj,
            a.o_proj,
            self.post_attention_layernorm,
            m.gate_up_proj,
            m.down_proj,
        )
        if lean:
            modules = tuple(x.op() if isinstance(x, RMSNorm) else linear_op(x) for x in modules)
        return LayerOps(*modules, a.num_heads, a.num_kv_heads, a.head_dim, m.intermediate_size)

    def forward(self, x, cos, sin, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        return decoder_layer(x, self.ops(), cos, sin, k_cache, v_cache, meta)
