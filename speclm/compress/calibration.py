"""Run a model layer by layer on calibration windows, capturing each Linear's input activations.

Layer-wise algorithms (GPTQ, SparseGPT, Wanda, AWQ, SmoothQuant) compress layer i from the inputs it
sees once layers 0..i-1 are already compressed, as the GPTQ paper does; `LayerwiseCalibration`
keeps the hidden states between layers so each layer runs once for capture and once to advance.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn
from tqdm import tqdm

from speclm.models.attention import AttentionMetadata
from speclm.models.layers import DecoderLayer
from speclm.models.llama import LlamaModel

# The Linear layers of a DecoderLayer in the built model; fused ones share one input.
LINEAR_NAMES = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class LayerwiseCalibration:
    """Hidden states of the calibration windows, advanced one decoder layer at a time."""

    def __init__(self, model: LlamaModel, windows: torch.Tensor) -> None:  # windows [n, seq_len]
        self.model = model
        seq_len = windows.shape[1]
        positions = torch.arange(seq_len)
        with torch.no_grad():
            self.cos, self.sin = model.rotary(positions)
            self.hidden = [model.embed_tokens(w) for w in windows]  # each [seq_len, hidden]
        self.seq_len = seq_len

    def _run_layer(self, layer: DecoderLayer, x: torch.Tensor, kv_absmax: torch.Tensor | None = None) -> torch.Tensor:
        cache = self.model.new_cache(self.seq_len, num_layers=1)  # scratch: each window starts empty
        k_cache, v_cache = cache.layer(0)
        out = layer(x, self.cos, self.sin, k_cache, v_cache, AttentionMetadata(0, self.seq_len))
        if kv_absmax is not None:  # [2, kv_heads]: running max |K| (after RoPE) and |V| per KV head
            kv_absmax[0] = torch.maximum(kv_absmax[0], k_cache.abs().amax(dim=(1, 2)))
            kv_absmax[1] = torch.maximum(kv_absmax[1], v_cache.abs().amax(dim=(1, 2)))
        return out

    @torch.no_grad()
    def kv_absmax(self, layer: DecoderLayer) -> torch.Tensor:
        """Max |key| and |value| per KV head over the calibration windows: [2, kv_heads]."""
        absmax = torch.zeros(2, self.model.config.num_kv_heads)
        for x in self.hidden:
            self._run_layer(layer, x, absmax)
        return absmax

    @torch.no_grad()
    def capture(self, layer: DecoderLayer, names: tuple[str, ...] = LINEAR_NAMES) -> dict[str, torch.Tensor]:
        """Inputs of the named Linear layers over all windows: name -> [n * seq_len, in_features]."""
        captured: dict[str, list[torch.Tensor]] = {name: [] for name in names}
        handles = []
        for name in names:
            module: nn.Linear = layer.get_submodule(name)
            handles.append(
                module.register_forward_pre_hook(
                    lambda _m, args, name=name: captured[name].append(args[0].detach().clone())
                )
            )
        try:
            for x in self.hidden:
                self._run_layer(layer, x)
        finally:
            for h in handles:
                h.remove()
        return {name: torch.cat(xs) for name, xs in captured.items()}

    @torch.no_grad()
    def advance(self, layer: DecoderLayer) -> None:
        """Replace the hidden states by this (now compressed) layer's outputs."""
        self.hidden = [self._run_layer(layer, x) for x in self.hidden]

    def layers(self, desc: str) -> Iterator[tuple[int, DecoderLayer]]:
        """Each decoder layer in order with a progress bar; the caller compresses it, then we advance."""
        for i, layer in enumerate(tqdm(self.model.layers, desc=desc, unit="layer")):
            yield i, layer
            self.advance(layer)


def hessian(x: torch.Tensor) -> torch.Tensor:
    """2/n X^T X [in, in]: the layer-wise reconstruction loss's Hessian. An fp32 matmul (as the GPTQ
    reference accumulates it): much faster than fp64, at a relative difference of ~1e-7."""
    x = x.float()
    return (2.0 / x.shape[0]) * (x.T @ x)
