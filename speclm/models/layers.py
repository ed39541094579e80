"""Building blocks of the llama-family decoder: RMSNorm, rotary embeddings, SwiGLU MLP, attention."""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from speclm.kernels import cpu_kernels
from speclm.models.config import ModelConfig
from speclm.models.quant_linear import Linear, linear_kernel


_NORM_KERNEL_DTYPES = (torch.float32, torch.bfloat16)  # weight dtypes speclm's rms_norm kernel takes


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square layer norm, computed in fp32 like the reference implementations; the result
    has the weight's dtype (bf16 weights give the bf16 activations the quantized formats compute in,
    without a separate cast). On the CPU, without gradients, speclm's kernel computes the same
    (one call instead of six ops)."""
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

    def kernel(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """forward as a closure over this norm's weight (see LayerKernels)."""
        return functools.partial(rms_norm, weight=self.weight, eps=self.eps)


def unscaled_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """theta^(-2i/head_dim) for i < head_dim/2, float64, before any rope_scaling."""
    dim = config.head_dim
    return 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))


def rope_inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim/2] and the attention scaling factor, honouring rope_scaling."""
    dim = config.head_dim
    inv_freq = unscaled_inverse_frequencies(config)
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        return inv_freq.float(), 1.0
    if kind == "freq_factors":  # llama.cpp's rope_freqs tensor: per-frequency divisors (llama3 GGUFs)
        factors = torch.tensor(scaling["factors"], dtype=torch.float64)
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope freq_factors has {factors.numel()} values, expected {inv_freq.numel()}")
        return (inv_freq / factors).float(), 1.0
    if kind == "linear":
        return (inv_freq / scaling["factor"]).float(), 1.0
    if kind == "llama3":
        factor = scaling["factor"]
        low_freq_factor = scaling.get("low_freq_factor", 1.0)
        high_freq_factor = scaling.get("high_freq_factor", 4.0)
        original = scaling.get("original_max_position_embeddings", 8192)
        low_freq_wavelen = original / low_freq_factor
        high_freq_wavelen = original / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
        return torch.where(is_medium, smoothed, scaled).float(), 1.0
    if kind == "yarn":
        factor = scaling["factor"]
        original = scaling.get("original_max_position_embeddings", config.max_position_embeddings)
        beta_fast, beta_slow = scaling.get("beta_fast", 32), scaling.get("beta_slow", 1)

        def correction_dim(num_rotations: float) -> float:
            return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(config.rope_theta))

        low = max(math.floor(correction_dim(beta_fast)), 0)
        high = min(math.ceil(correction_dim(beta_slow)), dim - 1)
        ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / max(high - low, 1e-3)).clamp(0, 1)
        extrapolation_weight = 1 - ramp
        inv = (inv_freq / factor) * (1 - extrapolation_weight) + inv_freq * extrapolation_weight
        attention_factor = scaling.get("attention_factor") or (0.1 * math.log(factor) + 1.0)
        return inv.float(), attention_factor
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3, yarn, freq_factors)")


class RotaryEmbedding(nn.Module):
    """Cos/sin tables in the half-split (GPT-NeoX / Hugging Face) layout, grown on demand."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        inv_freq, self.attention_scaling = rope_inverse_frequencies(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos_table", torch.empty(0), persistent=False)
        self.register_buffer("signed_sin_table", torch.empty(0), persistent=False)
        self._grow(max(config.max_position_embeddings, 1) if config.max_position_embeddings <= 32768 else 4096)

    def _grow(self, length: int) -> None:
        t = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq)  # [length, head_dim/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [length, head_dim]
        self.cos_table = emb.cos() * self.attention_scaling
        sin, half = emb.sin() * self.attention_scaling, emb.shape[-1] // 2
        self.signed_sin_table = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # see apply_rope

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (see apply_rope) for each position: [num_tokens, head_dim] each."""
        needed = int(positions.max()) + 1
        if needed > self.cos_table.shape[0]:
            self._grow(max(needed, 2 * self.cos_table.shape[0]))
        return self.cos_table[positions], self.signed_sin_table[positions]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [heads, num_tokens, head_dim] by the half-split rotary convention:
    x*cos + [-x2, x1]*sin, written as x*cos + roll(x)*[-sin, sin] (the same products, bit for bit,
    in 4 ops instead of 7: this runs twice per layer per decoded token)."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin


class DecodeRows(NamedTuple):
    """Query rows attended like plain decoding: row i reads lengths[i] keys, the slots
    slots[i, :lengths[i]] of the key tensor when slots is given, else its first lengths[i] keys."""

    lengths: torch.Tensor  # [n] int64
    slots: torch.Tensor | None = None  # [n, >= max(lengths)] int64

    @classmethod
    def causal(cls, total: int, n: int, device: torch.device | str = "cpu") -> "DecodeRows":
        """The last n of `total` keys' rows, each over its causal prefix (verification rows)."""
        return cls(torch.arange(total - n + 1, total + 1, device=device))

    @classmethod
    def tree(cls, start: int, paths: list[list[int]], device: torch.device | str = "cpu") -> "DecodeRows":
        """Token-tree rows written at slots start..: each reads slots 0..start-1, then its path."""
        depth = max(len(p) for p in paths)
        slots = torch.arange(start + depth).repeat(len(paths), 1)
        for i, path in enumerate(paths):
            slots[i, start : start + len(path)] = torch.tensor(path) + start
        return cls(torch.tensor([start + len(p) for p in paths]), slots).to(device)

    def to(self, device: torch.device | str) -> "DecodeRows":
        return DecodeRows(self.lengths.to(device), None if self.slots is None else self.slots.to(device))


def decode_kernels(t: torch.Tensor, dtype: torch.dtype = torch.float32) -> ModuleType | None:
    """speclm's compiled kernels when they apply to t (CPU, `dtype`, no gradient wanted), else None."""
    if t.device.type != "cpu" or t.dtype != dtype or (t.requires_grad and torch.is_grad_enabled()):
        return None
    return cpu_kernels()


def rope_kernels(qkv: torch.Tensor, cos: torch.Tensor, k_cache) -> ModuleType | None:
    """speclm's kernels when rope_qkv can take this QKV output (CPU, fp32 or bf16, no gradient) and
    write into this cache (an fp32 tensor: not an int8 paged pool), else None."""
    if not isinstance(k_cache, torch.Tensor) or k_cache.dtype != torch.float32 or cos.dtype != torch.float32:
        return None
    if qkv.dim() != 2 or qkv.stride(-1) != 1:
        return None
    return decode_kernels(qkv, qkv.dtype) if qkv.dtype in (torch.float32, torch.bfloat16) else None


def attend_like_decoding(
    q: torch.Tensor,  # [heads, n, head_dim]
    keys: torch.Tensor,  # [kv_heads, num_slots, head_dim]
    values: torch.Tensor,
    rows: DecodeRows,
) -> torch.Tensor:
    """Attention for rows whose logits are checked against plain decoding (the decoded token
    itself, speculative verification rows, token trees, a prompt's last token): each row is
    computed exactly as plain decoding computes that token once its keys are committed, whatever
    the other rows. speclm's CPU kernel does that in one call; without it, each row makes the
    one-query SDPA call plain decoding makes (SDPA over many rows accumulates in another order,
    and with bf16 activations that flipped greedy near-ties). Returns [heads, n, head_dim]."""
    kernels = decode_kernels(q)
    if kernels is not None:
        empty = rows.lengths[:0]
        return kernels.attend_rows(q, keys, values, rows.lengths, empty if rows.slots is None else rows.slots,
                                   q.shape[-1] ** -0.5)
    gqa, out = q.shape[0] != keys.shape[0], []
    for i, length in enumerate(rows.lengths.tolist()):
        index = slice(0, length) if rows.slots is None else rows.slots[i, :length]
        out.append(F.scaled_dot_product_attention(
            q[None, :, i : i + 1], keys[None, :, index], values[None, :, index], enable_gqa=gqa)[0])
    return torch.cat(out, dim=1)


@dataclass
class AttentionMetadata:
    """Where a forward pass's tokens go in the KV cache and what they may attend to.

    `start` is the cache slot of the first new token; the new tokens occupy slots
    [start, start + num_tokens). `mask` ([num_tokens, start + num_tokens], True = may attend) is
    None for the usual causal case. `paths` (per new row, the new rows from the first down to
    itself) marks a token-tree verification pass: each row attends to the prefix and its path only.
    Rows after a prefix (decoding, verification) and tree rows attend like decoding
    (attend_like_decoding); a prompt from slot 0 or with a mask runs one SDPA call.
    """

    start: int
    num_tokens: int
    mask: torch.Tensor | None = None
    paths: list[list[int]] | None = None
    _rows: DecodeRows | None = field(default=None, init=False, repr=False)  # built once, used by every layer
    _slots: torch.Tensor | None = field(default=None, init=False, repr=False)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    def sdpa_mask(self) -> tuple[torch.Tensor | None, bool]:
        """(attn_mask, is_causal) arguments for scaled_dot_product_attention."""
        if self.mask is not None:
            return self.mask, False
        if self.num_tokens == 1:
            return None, False
        if self.start == 0:
            return None, True
        q_pos = torch.arange(self.start, self.end).unsqueeze(1)
        k_pos = torch.arange(self.end).unsqueeze(0)
        return k_pos <= q_pos, False

    def decode_rows(self, device: torch.device) -> DecodeRows | None:
        """The rows' DecodeRows when they attend like decoding, else None (one SDPA call)."""
        like_decoding = self.paths is not None or (self.mask is None and (self.start > 0 or self.num_tokens == 1))
        if self._rows is None and like_decoding:
            self._rows = (DecodeRows.causal(self.end, self.num_tokens, device) if self.paths is None
                          else DecodeRows.tree(self.start, self.paths, device))
        return self._rows

    def attend(
        self,
        q: torch.Tensor,  # [heads, num_tokens, head_dim]
        k: torch.Tensor,  # [kv_heads, num_tokens, head_dim]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # [kv_heads, capacity, head_dim]
        v_cache: torch.Tensor,
    ) -> torch.Tensor:
        """Write the new keys/values at slots start.., attend over slots 0..end; [heads, num_tokens, head_dim]."""
        k_cache[:, self.start : self.end] = k
        v_cache[:, self.start : self.end] = v
        return self.attend_cached(q, k_cache, v_cache)

    def write_slots(self, device: torch.device) -> torch.Tensor:
        """The cache slot of each new token, [num_tokens] (rope_qkv writes keys/values there)."""
        if self._slots is None:
            self._slots = torch.arange(self.start, self.end, device=device)
        return self._slots

    def attend_cached(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """attend, once the new keys/values are in the cache."""
        rows = self.decode_rows(q.device)
        if rows is not None:
            return attend_like_decoding(q, k_cache, v_cache, rows)
        attn_mask, is_causal = self.sdpa_mask()
        return F.scaled_dot_product_attention(
            q.unsqueeze(0),
            k_cache[:, : self.end].unsqueeze(0),
            v_cache[:, : self.end].unsqueeze(0),
            attn_mask=attn_mask,
            is_causal=is_causal,
            enable_gqa=q.shape[0] != k_cache.shape[0],
        )[0]


TensorFn = Callable[[torch.Tensor], torch.Tensor]  # a linear layer or a norm, as a callable


def self_attention(
    x: torch.Tensor,  # [num_tokens, hidden]: the normed input
    qkv_proj: TensorFn,
    o_proj: TensorFn,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    cos: torch.Tensor,  # [num_tokens, head_dim]
    sin: torch.Tensor,
    k_cache: torch.Tensor,  # [kv_heads, capacity, head_dim]
    v_cache: torch.Tensor,
    meta: AttentionMetadata,  # or PagedAttentionMetadata (speclm.kv.paged_cache)
) -> torch.Tensor:
    """Grouped-query self-attention with a fused QKV projection and an external KV cache."""
    n, h, kv = x.shape[0], num_heads, num_kv_heads
    # Attention runs in the cache's dtype (LlamaModel.attn_dtype: fp32 on the CPU, also when the
    # layers compute in bf16), rotary included; o_proj gets the layer's dtype back.
    # The metadata knows the cache layout (one contiguous sequence, or paged slots of a batch).
    qkv = qkv_proj(x)
    kernels = rope_kernels(qkv, cos, k_cache)
    if kernels is not None:  # one call: rotate, write keys/values to their slots, return q
        q = kernels.rope_qkv(qkv, cos, sin, h, kv, k_cache, v_cache, meta.write_slots(qkv.device))
        out = meta.attend_cached(q, k_cache, v_cache)  # [heads, num_tokens, head_dim]
    else:
        if qkv.dtype != cos.dtype:
            qkv = qkv.to(cos.dtype)
        qkv = qkv.view(n, h + 2 * kv, head_dim).transpose(0, 1)  # [heads + 2 kv, n, d]
        qk = apply_rope(qkv[: h + kv], cos, sin)  # q and k rotated in one go
        out = meta.attend(qk[:h], qk[h:], qkv[h + kv :], k_cache, v_cache)
    out = out.transpose(0, 1).reshape(n, -1)
    return o_proj(out if out.dtype == x.dtype else out.to(x.dtype))


def swiglu(x: torch.Tensor, gate_up_proj: TensorFn, down_proj: TensorFn, intermediate_size: int) -> torch.Tensor:
    """SwiGLU feed-forward with a fused gate/up projection (silu and product in one kernel call for
    bf16 activations on the CPU)."""
    gate_up = gate_up_proj(x)
    kernels = decode_kernels(gate_up, torch.bfloat16) if gate_up.dim() == 2 and gate_up.stride(-1) == 1 else None
    if kernels is not None:
        return down_proj(kernels.silu_mul(gate_up))
    gate, up = gate_up.split(intermediate_size, dim=-1)
    return down_proj(F.silu(gate) * up)


class LayerKernels(NamedTuple):
    """One decoder layer as plain callables: its modules, or (lean) closures over their tensors.

    Lean kernels compute exactly what the modules compute, without nn.Module dispatch and attribute
    lookups: on SmolLM2-135M int4 they took a forward pass for one token from 14.0 to 12.3 ms at 1
    thread and from 10.6 to 9.0 ms at 2 (this CPU).
    They do not see modules replaced or hooked after they were made (LlamaModel.use_lean_kernels).
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


def decoder_layer(x, k: LayerKernels, cos, sin, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""
    x = x + self_attention(k.input_norm(x), k.qkv_proj, k.o_proj, k.num_heads, k.num_kv_heads, k.head_dim,
                           cos, sin, k_cache, v_cache, meta)
    return x + swiglu(k.post_attention_norm(x), k.gate_up_proj, k.down_proj, k.intermediate_size)


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
        return self_attention(x, self.qkv_proj, self.o_proj, self.num_heads, self.num_kv_heads, self.head_dim,
                              cos, sin, k_cache, v_cache, meta)


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

    def kernels(self, lean: bool = False) -> LayerKernels:
        """This layer's callables: its modules, or with lean=True closures over their tensors."""
        a, m = self.self_attn, self.mlp
        modules = (self.input_layernorm, a.qkv_proj, a.o_proj, self.post_attention_layernorm, m.gate_up_proj,
                   m.down_proj)
        if lean:
            modules = tuple(x.kernel() if isinstance(x, RMSNorm) else linear_kernel(x) for x in modules)
        return LayerKernels(*modules, a.num_heads, a.num_kv_heads, a.head_dim, m.intermediate_size)

    def forward(self, x, cos, sin, k_cache, v_cache, meta: AttentionMetadata) -> torch.Tensor:
        return decoder_layer(x, self.kernels(), cos, sin, k_cache, v_cache, meta)
