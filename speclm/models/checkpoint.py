"""The in-memory checkpoint form every loader produces, and building a model from it."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speclm.models.config import ModelConfig
from speclm.models.llama import LlamaModel


class ModelLoadError(ValueError):
    """A model file is missing, corrupt, or describes something speclm cannot run."""


@dataclass
class Checkpoint:
    """Weights under Hugging Face tensor names (model.layers.N.self_attn.q_proj.weight, ...), fp32."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    source: str
    metadata: dict = field(default_factory=dict)


def layer_tensor(tensors: dict[str, torch.Tensor], layer: int, name: str) -> torch.Tensor | None:
    return tensors.get(f"model.layers.{layer}.{name}")


def build_model(checkpoint: Checkpoint, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LlamaModel:
    """Instantiate the decoder and copy the checkpoint's weights in, fusing QKV and gate/up."""
    config, t = checkpoint.config, checkpoint.tensors
    with torch.device("meta"):
        model = LlamaModel(config)
    model = model.to_empty(device=device)

    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        if name not in t:
            raise ModelLoadError(f"{checkpoint.source}: missing tensor {name!r}")
        return t[name]

    state: dict[str, torch.Tensor] = {
        "embed_tokens.weight": take("model.embed_tokens.weight"),
        "norm.weight": take("model.norm.weight"),
    }
    if not config.tie_word_embeddings:
        state["lm_head.weight"] = take("lm_head.weight")
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        attn, mlp = f"layers.{i}.self_attn.", f"layers.{i}.mlp."
        state[f"layers.{i}.input_layernorm.weight"] = take(p + "input_layernorm.weight")
        state[f"layers.{i}.post_attention_layernorm.weight"] = take(p + "post_attention_layernorm.weight")
        state[attn + "qkv_proj.weight"] = torch.cat(
            [take(p + f"self_attn.{x}_proj.weight") for x in "qkv"], dim=0
        )
        if config.attention_bias:
            state[attn + "qkv_proj.bias"] = torch.cat([take(p + f"self_attn.{x}_proj.bias") for x in "qkv"], dim=0)
        state[attn + "o_proj.weight"] = take(p + "self_attn.o_proj.weight")
        if config.attention_output_bias:
            state[attn + "o_proj.bias"] = take(p + "self_attn.o_proj.bias")
        state[mlp + "gate_up_proj.weight"] = torch.cat(
            [take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], dim=0
        )
        state[mlp + "down_proj.weight"] = take(p + "mlp.down_proj.weight")
    ignorable = ("lm_head.weight",) if config.tie_word_embeddings else ()
    unused = sorted(k for k in t if k not in used and k not in ignorable and not k.endswith("rotary_emb.inv_freq"))
    if unused:
        # A dropped tensor (an unsupported bias, say) would silently change the model's output.
        raise ModelLoadError(
            f"{checkpoint.source}: tensors speclm's {config.architecture} model does not use: "
            f"{', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''} (unsupported model feature)"
        )
    expected = {k: v.shape for k, v in model.state_dict().items() if k not in ("lm_head.weight",) or not config.tie_word_embeddings}
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name]):
            raise ModelLoadError(
                f"{checkpoint.source}: tensor {name} has shape {tuple(tensor.shape)}, config implies {tuple(expected[name])}"
            )
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    model.rotary = type(model.rotary)(config).to(device)  # buffers were on meta
    return model.eval()
