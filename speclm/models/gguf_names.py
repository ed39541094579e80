"""Tensor names: llama.cpp's (GGUF files) and Hugging Face's (speclm's Checkpoint), both ways."""

from __future__ import annotations

import re

# llama.cpp suffix -> Hugging Face suffix, per layer (blk.N. / model.layers.N.) and model-wide.
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}

# Hugging Face suffix -> llama.cpp suffix (the tables above, inverted).
_TO_GGUF_LAYER = {hf: gg for gg, hf in LAYER_NAMES.items()}
_TO_GGUF_GLOBAL = {hf: gg for gg, hf in GLOBAL_NAMES.items()}


def gguf_name(hf_name: str) -> str:
    """The llama.cpp name of a Hugging Face tensor name (model.layers.3.mlp.up_proj.weight -> blk.3.ffn_up.weight)."""
    if hf_name in _TO_GGUF_GLOBAL:
        return _TO_GGUF_GLOBAL[hf_name]
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in _TO_GGUF_LAYER:
        return f"blk.{parts[2]}.{_TO_GGUF_LAYER[parts[3]]}"
    raise ValueError(f"tensor {hf_name!r} has no GGUF name (not part of a llama-family model)")


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor name (blk.3.ffn_up.weight -> model.layers.3.mlp.up_proj.weight),
    or None for a tensor speclm's models do not have."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    return None
