"""Loading a checkpoint with its tokenizer, and turning a built model back into HF-named tensors."""

from __future__ import annotations

import torch

from speclm.models.builder import build_model
from speclm.models.checkpoint import Checkpoint
from speclm.models.llama import LlamaModel
from speclm.models.loader import load_checkpoint
from speclm.tokenizer import Tokenizer, load_tokenizer

# Built-model linear -> the HF linears it fuses (rows concatenated in this order).
FUSED_LINEARS = {
    "self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o_proj": ("self_attn.o_proj",),
    "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down_proj": ("mlp.down_proj",),
}


def load_with_tokenizer(model: str | None, tokenizer: str | None = None) -> tuple[Checkpoint, Tokenizer]:
    """The fp32 checkpoint and its tokenizer (the one inside the model unless `tokenizer` is given)."""
    checkpoint = load_checkpoint(model)
    return checkpoint, load_tokenizer(checkpoint.source, tokenizer)


def split_sizes(model: LlamaModel, fused: str) -> list[int]:
    """Row counts of the HF linears inside one fused built-model linear."""
    c = model.config
    if fused == "self_attn.qkv_proj":
        return [c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.num_kv_heads * c.head_dim]
    if fused == "mlp.gate_up_proj":
        return [c.intermediate_size, c.intermediate_size]
    return [model.get_submodule(f"layers.0.{fused}").weight.shape[0]]


def split_fused(model: LlamaModel, fused: str, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows of a fused tensor (weight, or per-row quantization params) under the HF linear names."""
    parts = tensor.split(split_sizes(model, fused), dim=0)
    return dict(zip(FUSED_LINEARS[fused], parts))


def model_to_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The inverse of build_model: HF-named fp32 tensors (q/k/v and gate/up unfused), the families' extra
    norms included (gemma3's q norm without the attention scale the builder folds into it)."""
    c = model.config
    out = {
        "model.embed_tokens.weight": model.embed_tokens.weight,
        "model.norm.weight": model.norm.weight,
    }
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = model.lm_head.weight
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
        for fused in FUSED_LINEARS:
            module = layer.get_submodule(fused)
            for name, part in split_fused(model, fused, module.weight).items():
                out[p + name + ".weight"] = part
            if module.bias is not None:
                for name, part in split_fused(model, fused, module.bias).items():
                    out[p + name + ".bias"] = part
        for norm, name in layer.extra_norms() if hasattr(layer, "extra_norms") else ():  # (variants.py)
            weight = norm.weight
            if name == "self_attn.q_norm" and c.attention_scale is not None:
                weight = weight / (c.attention_scale * c.head_dim**0.5)
            out[p + name + ".weight"] = weight
    return {k: v.detach().float().contiguous().clone() for k, v in out.items()}


def rebuild(checkpoint: Checkpoint) -> LlamaModel:
    """A fresh fp32 model for the checkpoint, on copies of its tensors: build_model assigns the
    checkpoint's tensors as parameters, and the compression algorithms edit parameters in place."""
    copies = {k: v.clone() for k, v in checkpoint.tensors.items()}
    return build_model(Checkpoint(checkpoint.config, copies, checkpoint.source, checkpoint.metadata))
