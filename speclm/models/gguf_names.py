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

# Per architecture, the layer suffixes where a family differs from llama's table (added or overriding):
# qwen3's q/k norms; gemma3's q/k norms and its four norms per layer (ffn_norm is the norm before the
# MLP there, post_attention_norm the one after attention); phi3's fused q/k/v and gate/up (llama.cpp's
# ffn_up holds gate then up there; the loader splits both, families.fused_parts). See speclm/models/families.py.
FAMILY_LAYER_NAMES = {
    "qwen3": {
        "attn_q_norm.weight": "self_attn.q_norm.weight",
        "attn_k_norm.weight": "self_attn.k_norm.weight",
    },
    "gemma3": {
        "attn_q_norm.weight": "self_attn.q_norm.weight",
        "attn_k_norm.weight": "self_attn.k_norm.weight",
        "post_attention_norm.weight": "post_attention_layernorm.weight",
        "ffn_norm.weight": "pre_feedforward_layernorm.weight",
        "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
    },
    "phi3": {
        "attn_qkv.weight": "self_attn.qkv_proj.weight",
        "ffn_up.weight": "mlp.gate_up_proj.weight",
    },
}


def layer_names(arch: str = "llama") -> dict[str, str]:
    """llama.cpp layer suffix -> Hugging Face layer suffix for an architecture (llama's table, with the
    family's additions and overrides)."""
    return LAYER_NAMES | FAMILY_LAYER_NAMES.get(arch, {})


# Hugging Face suffix -> llama.cpp suffix (the tables above, inverted).
_TO_GGUF_LAYER = {arch: {hf: gg for gg, hf in layer_names(arch).items()} for arch in ("llama", *FAMILY_LAYER_NAMES)}
_TO_GGUF_GLOBAL = {hf: gg for gg, hf in GLOBAL_NAMES.items()}


def gguf_name(hf_name: str, arch: str = "llama") -> str:
    """The llama.cpp name of a Hugging Face tensor name (model.layers.3.mlp.up_proj.weight -> blk.3.ffn_up.weight)
    in a GGUF file of architecture `arch`."""
    if hf_name in _TO_GGUF_GLOBAL:
        return _TO_GGUF_GLOBAL[hf_name]
    table = _TO_GGUF_LAYER.get(arch, _TO_GGUF_LAYER["llama"])
    parts = hf_name.split(".", 3)
    if len(parts) == 4 and parts[:2] == ["model", "layers"] and parts[3] in table:
        return f"blk.{parts[2]}.{table[parts[3]]}"
    raise ValueError(f"tensor {hf_name!r} has no GGUF name (not part of a llama-family model)")


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The Hugging Face name of a llama.cpp tensor name (blk.3.ffn_up.weight -> model.layers.3.mlp.up_proj.weight)
    in a GGUF file of architecture `arch`, or None for a tensor speclm's models do not have."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    table = layer_names(arch)
    m = re.fullmatch(r"blk\.(\d+)\.(.+)", gguf_name)
    if m and m.group(2) in table:
        return f"model.layers.{m.group(1)}.{table[m.group(2)]}"
    return None
