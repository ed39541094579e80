"""Draft-model students: a few target layers on the target's embeddings, saved as a Hugging Face dir."""

from __future__ import annotations

import dataclasses
import json
import os

import torch

from speclm.compress.model_io import model_to_tensors
from speclm.compress.save import save_checkpoint
from speclm.distill.losses import layer_map
from speclm.models.attention import AttentionMetadata
from speclm.models.builder import build_model
from speclm.models.checkpoint import Checkpoint
from speclm.models.llama import LlamaModel
from speclm.speculative.draft_model import TOKEN_MAP_FILE
from speclm.tokenizer import Tokenizer


def init_draft_model(target: Checkpoint, num_layers: int, style: str = "uniform") -> tuple[LlamaModel, list[int]]:
    """An fp32 student with `num_layers` decoder layers copied from the target's (layer_map `style`),
    the target's embeddings, final norm and (tied) head. Every tensor is a copy: build_model adopts the
    checkpoint's tensors as parameters, and training must not edit the target's.
    Returns (model, the teacher layer each student layer came from)."""
    c = target.config
    if not 1 <= num_layers <= c.num_layers:
        raise ValueError(f"draft layers must be in 1..{c.num_layers} (the target's), got {num_layers}")
    chosen = layer_map(num_layers, c.num_layers, style)
    tensors = {}
    for name, value in target.tensors.items():
        if name.startswith("model.layers."):
            _, _, index, rest = name.split(".", 3)
            for i, source in enumerate(chosen):
                if int(index) == source:
                    tensors[f"model.layers.{i}.{rest}"] = value.clone()
        else:
            tensors[name] = value.clone()
    config = dataclasses.replace(c, num_layers=num_layers, eos_token_ids=list(c.eos_token_ids))
    model = build_model(Checkpoint(config, tensors, target.source, dict(target.metadata)))
    return model, chosen


class PerLayerCache:
    """KV storage for one training forward, a separate pair of tensors per layer. A KVCache keeps all
    layers in one tensor, and autograd rejects that under backprop: layer i saves a view of it for the
    backward pass and layer i+1's write into the same storage invalidates it ("modified by an inplace
    operation"). The cache is scratch space here; nothing reads it after the forward."""

    def __init__(self, model: LlamaModel, num_tokens: int) -> None:
        c, p = model.config, model.embed_tokens.weight
        self.shape, self.dtype = (c.num_kv_heads, num_tokens, c.head_dim), p.dtype

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.zeros(self.shape, dtype=self.dtype), torch.zeros(self.shape, dtype=self.dtype)


def training_hidden_states(model: LlamaModel, tokens: torch.Tensor) -> torch.Tensor:
    """Causal post-norm hidden states [n, hidden] of `tokens` [n] from position 0, with autograd."""
    n = tokens.numel()
    return model.hidden_states(tokens, torch.arange(n), PerLayerCache(model, n), AttentionMetadata(0, n))


def trainable_draft_parameters(model: LlamaModel) -> list[torch.nn.Parameter]:
    """The decoder layers and final norm; the embedding (= tied head, ~80% of a small draft's
    weights) stays the target's, so the draft shares its token geometry and trains fast."""
    params = [p for layer in model.layers for p in layer.parameters()] + list(model.norm.parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    return params


def save_draft_model(
    model: LlamaModel,
    tokenizer: Tokenizer,
    out_dir: str,
    token_map: torch.Tensor | None = None,
    metadata: dict | None = None,
) -> None:
    """A Hugging Face model directory (config.json, model.safetensors, tokenizer files) that speclm's
    loader and transformers both read, plus speclm_token_map.json when the draft's head is restricted
    to a frequent-token subset (DraftModelProposer reads it)."""
    save_checkpoint(out_dir, model.config, model_to_tensors(model), tokenizer, metadata)
    path = os.path.join(out_dir, TOKEN_MAP_FILE)
    if token_map is not None:
        with open(path, "w") as f:
            json.dump([int(t) for t in token_map], f)
    elif os.path.exists(path):
        os.remove(path)  # a stale map from an earlier run would silently restrict this draft
