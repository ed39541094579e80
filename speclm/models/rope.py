"""Rotary position embeddings: inverse frequencies with rope_scaling (linear, llama3, yarn, LongRoPE, GGUF
freq factors), the cos/sin tables, and the rotation of each head's first rotary_dim dims (all of them but
where a config says partial rotary)."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from speclm.models.config import ModelConfig


def unscaled_inverse_frequencies(config: ModelConfig) -> torch.Tensor:
    """theta^(-2i/rotary_dim) for i < rotary_dim/2, float64, before any rope_scaling."""
    dim = config.rotary_dim
    # Computed on the CPU even inside a meta-device context (the model's skeleton): arithmetic on meta
    # tensors imports torch's symbolic-shape machinery, tens of MB, for tables rebuilt after loading.
    return 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device="cpu") / dim))


def rope_inverse_frequencies(config: ModelConfig) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [rotary_dim/2] and the attention scaling factor, honouring rope_scaling."""
    dim = config.rotary_dim
    inv_freq = unscaled_inverse_frequencies(config)
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        return inv_freq.float(), 1.0
    if kind == "freq_factors":  # llama.cpp's rope_freqs tensor: per-frequency divisors (llama3 GGUFs)
        factors = torch.tensor(scaling["factors"], dtype=torch.float64, device="cpu")
        if factors.shape != inv_freq.shape:
            raise ValueError(f"rope freq_factors has {factors.numel()} values, expected {inv_freq.numel()}")
        return (inv_freq / factors).float(), 1.0
    if kind == "longrope":
        # LongRoPE (phi3): the long factors where the context runs past the original one. The context decides,
        # as in llama.cpp, so a sequence's keys and queries turn alike; transformers decides by the sequence's
        # length and recomputes its cache when it crosses (the same numbers from there on).
        long = config.max_position_embeddings > scaling["original_max_position_embeddings"]
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float64, device="cpu")
        if factors.shape != inv_freq.shape:
            raise ValueError(f"longrope has {factors.numel()} factors, expected {inv_freq.numel()} (rotary_dim / 2)")
        return (inv_freq / factors).float(), float(scaling["attention_factor"])
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
        ramp = ((torch.arange(dim // 2, dtype=torch.float64, device="cpu") - low) / max(high - low, 1e-3)).clamp(0, 1)
        extrapolation_weight = 1 - ramp
        inv = (inv_freq / factor) * (1 - extrapolation_weight) + inv_freq * extrapolation_weight
        attention_factor = scaling.get("attention_factor") or (0.1 * math.log(factor) + 1.0)
        return inv.float(), attention_factor
    raise ValueError(
        f"unsupported rope_scaling type {kind!r} (supported: default, linear, llama3, yarn, longrope, freq_factors)"
    )


INITIAL_POSITIONS = 4096  # the tables' first size; they double when a position past them is asked for


class RotaryEmbedding(nn.Module):
    """Cos/sin tables in the half-split (GPT-NeoX / Hugging Face) layout, grown on demand."""

    def __init__(self, config: ModelConfig, local: bool = False) -> None:
        super().__init__()
        if local:  # a local (sliding-window) layer's tables: its own base, no scaling (gemma3)
            config = dataclasses.replace(config, rope_theta=config.rope_local_theta, rope_scaling=None)
        self.local = local
        inv_freq, self.attention_scaling = rope_inverse_frequencies(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.register_buffer("cos_table", torch.empty(0), persistent=False)
        self.register_buffer("signed_sin_table", torch.empty(0), persistent=False)
        # A model's whole context (32k for Qwen2.5) would be 32 MB of tables built at load, most never read.
        self._grow(min(max(config.max_position_embeddings, 1), INITIAL_POSITIONS))

    def _grow(self, length: int) -> None:
        t = torch.arange(length, dtype=torch.float32, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq)  # [length, rotary_dim/2]
        emb = torch.cat([freqs, freqs], dim=-1)  # [length, rotary_dim]
        self.cos_table = emb.cos() * self.attention_scaling
        sin, half = emb.sin() * self.attention_scaling, emb.shape[-1] // 2
        self.signed_sin_table = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1)  # see apply_rope

    def forward(self, positions: torch.Tensor, max_position: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin (see apply_rope) for each position: [num_tokens, rotary_dim] each. `max_position`,
        when the caller knows it, spares reading positions' maximum back from the device (a sync on a GPU)."""
        self.reserve((int(positions.max()) if max_position is None else max_position) + 1)
        return self.cos_table[positions], self.signed_sin_table[positions]

    def reserve(self, length: int) -> None:
        """Tables for positions 0..length-1 at least (they move when they grow: CUDA graphs hold their address)."""
        if length > self.cos_table.shape[0]:
            self._grow(max(length, 2 * self.cos_table.shape[0]))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [heads, num_tokens, head_dim] by the half-split rotary convention:
    x*cos + [-x2, x1]*sin, written as x*cos + roll(x)*[-sin, sin] (the same products, bit for bit,
    in 4 ops instead of 7: this runs twice per layer per decoded token). Tables narrower than the head
    ([num_tokens, rotary_dim]) turn its first rotary_dim dims and pass the rest (partial rotary)."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        turned = apply_rope(x[..., :rotary_dim], cos, signed_sin)
        return torch.cat([turned, x[..., rotary_dim:]], dim=-1)
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin
