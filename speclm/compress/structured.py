"""Structured pruning that shrinks the tensors: MLP intermediate channels and attention KV groups
(a KV head with the query heads that share it), the same count in every layer so the result is an
ordinary, smaller llama config that any loader runs."""

from __future__ import annotations

import copy

import torch

from speclm.compress.calibration import LayerwiseCalibration
from speclm.models.checkpoint import Checkpoint
from speclm.models.config import ModelConfig
from speclm.models.llama import LlamaModel

STRUCTURED_METHODS = ("mlp-channels", "attention-heads")


def _input_norms(model: LlamaModel, windows: torch.Tensor | None, name: str) -> list[torch.Tensor | None]:
    """Per layer, the L2 norm of each input feature of `name` over the calibration tokens (None without text)."""
    if windows is None:
        return [None] * len(model.layers)
    norms = []
    calib = LayerwiseCalibration(model, windows)
    for _, layer in calib.layers(f"importance ({name})"):
        norms.append(calib.capture(layer, (name,))[name].float().pow(2).sum(dim=0).sqrt())
    return norms


def _keep(scores: torch.Tensor, fraction: float) -> torch.Tensor:
    """Sorted indices of the highest-scoring (1 - fraction) of the units, at least one."""
    keep = max(1, scores.numel() - int(round(scores.numel() * fraction)))
    return torch.sort(torch.topk(scores, keep).indices).values


@torch.no_grad()
def prune_structured(
    checkpoint: Checkpoint, model: LlamaModel, method: str, fraction: float, windows: torch.Tensor | None = None
) -> Checkpoint:
    """A smaller checkpoint with `fraction` of the MLP channels or KV groups of every layer removed.
    Importance: weight norms of the unit's output projection columns, times the L2 norm of their
    calibration activations when windows are given (Wanda-style, per unit)."""
    if method not in STRUCTURED_METHODS:
        raise ValueError(f"unknown structured method {method!r}; choose from {', '.join(STRUCTURED_METHODS)}")
    if not 0 <= fraction < 1:
        raise ValueError(f"--sparsity must be in [0, 1), got {fraction}")
    c = model.config
    tensors = dict(checkpoint.tensors)
    config: ModelConfig = copy.deepcopy(c)
    if method == "mlp-channels":
        norms = _input_norms(model, windows, "mlp.down_proj")
        for i, layer in enumerate(model.layers):
            down = layer.mlp.down_proj.weight  # [hidden, intermediate]
            score = down.norm(dim=0) * (norms[i] if norms[i] is not None else 1.0)
            keep = _keep(score, fraction)
            p = f"model.layers.{i}.mlp."
            for name in ("gate_proj", "up_proj"):
                tensors[p + name + ".weight"] = tensors[p + name + ".weight"][keep].contiguous()
            tensors[p + "down_proj.weight"] = tensors[p + "down_proj.weight"][:, keep].contiguous()
            config.intermediate_size = keep.numel()
        return Checkpoint(config, tensors, checkpoint.source, checkpoint.metadata)
    group = c.num_heads // c.num_kv_heads  # query heads per KV head
    norms = _input_norms(model, windows, "self_attn.o_proj")
    for i, layer in enumerate(model.layers):
        cols = layer.self_attn.o_proj.weight.norm(dim=0) * (
            norms[i] if norms[i] is not None else 1.0
        )  # [heads*head_dim]
        score = cols.view(c.num_kv_heads, group * c.head_dim).norm(dim=1)
        keep_kv = _keep(score, fraction)
        q_heads = (keep_kv.unsqueeze(1) * group + torch.arange(group)).flatten()
        q_rows = (q_heads.unsqueeze(1) * c.head_dim + torch.arange(c.head_dim)).flatten()
        kv_rows = (keep_kv.unsqueeze(1) * c.head_dim + torch.arange(c.head_dim)).flatten()
        p = f"model.layers.{i}.self_attn."
        for name, rows in (("q_proj", q_rows), ("k_proj", kv_rows), ("v_proj", kv_rows)):
            tensors[p + name + ".weight"] = tensors[p + name + ".weight"][rows].contiguous()
            if p + name + ".bias" in tensors:
                tensors[p + name + ".bias"] = tensors[p + name + ".bias"][rows].contiguous()
        tensors[p + "o_proj.weight"] = tensors[p + "o_proj.weight"][:, q_rows].contiguous()
        config.num_kv_heads = keep_kv.numel()
        config.num_heads = keep_kv.numel() * group
    return Checkpoint(config, tensors, checkpoint.source, checkpoint.metadata)
