"""Unstructured and N:M pruning of the decoder Linears: magnitude (per layer or global), Wanda, SparseGPT."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from speclm.compress.calibration import LINEAR_NAMES, LayerwiseCalibration, hessian
from speclm.compress.sparsegpt import sparsegpt
from speclm.models.llama import LlamaModel

METHODS = ("magnitude", "magnitude-global", "wanda", "sparsegpt")
CALIBRATED = ("wanda", "sparsegpt")


@dataclass
class PruneOptions:
    """Unstructured `sparsity` in [0, 1), or an N:M pattern (N zeros in every M consecutive inputs)."""

    method: str
    sparsity: float = 0.5
    prune_n: int = 0
    prune_m: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown pruning method {self.method!r}; choose from {', '.join(METHODS)}")
        if self.prune_m:
            if not 0 < self.prune_n < self.prune_m:
                raise ValueError(f"N:M pattern needs 0 < N < M, got {self.prune_n}:{self.prune_m}")
            if self.method == "magnitude-global":
                raise ValueError("an N:M pattern is per row; use magnitude, wanda or sparsegpt")
            self.sparsity = self.prune_n / self.prune_m
        elif not 0 <= self.sparsity < 1:
            raise ValueError(f"--sparsity must be in [0, 1), got {self.sparsity}")

    @property
    def label(self) -> str:
        return f"{self.method} {self.prune_n}:{self.prune_m}" if self.prune_m else f"{self.method} {self.sparsity:.0%}"


def lowest_mask(metric: torch.Tensor, options: PruneOptions) -> torch.Tensor:
    """True where a weight is pruned: the lowest `metric` of each row (the sparsity fraction),
    or the N lowest of every M consecutive columns."""
    rows, cols = metric.shape
    if options.prune_m:
        if cols % options.prune_m:
            raise ValueError(f"{cols} input features are not a multiple of M={options.prune_m}")
        groups = metric.reshape(rows, cols // options.prune_m, options.prune_m)
        idx = torch.topk(groups, options.prune_n, dim=2, largest=False)[1]
        return torch.zeros_like(groups, dtype=torch.bool).scatter_(2, idx, True).reshape(rows, cols)
    k = int(cols * options.sparsity)
    mask = torch.zeros_like(metric, dtype=torch.bool)
    if k:
        mask.scatter_(1, torch.topk(metric, k, dim=1, largest=False)[1], True)
    return mask


def decoder_linears(model: LlamaModel) -> list[torch.nn.Linear]:
    return [layer.get_submodule(name) for layer in model.layers for name in LINEAR_NAMES]


def sparsity_of(model: LlamaModel) -> float:
    """Fraction of exact zeros over all decoder Linear weights."""
    zeros = total = 0
    for module in decoder_linears(model):
        zeros += int((module.weight == 0).sum())
        total += module.weight.numel()
    return zeros / total


@torch.no_grad()
def prune_model(model: LlamaModel, options: PruneOptions, windows: torch.Tensor | None = None) -> float:
    """Prune the decoder Linears in place; returns the achieved sparsity. Wanda's metric is
    |W| * ||X_j||_2 compared per output row; SparseGPT reconstructs layer by layer."""
    if options.method in CALIBRATED and windows is None:
        raise ValueError(f"{options.method} needs calibration text (--calib-text)")
    if options.method == "magnitude":
        for module in decoder_linears(model):
            module.weight[lowest_mask(module.weight.abs(), options)] = 0
    elif options.method == "magnitude-global":
        magnitudes = torch.cat([m.weight.abs().flatten() for m in decoder_linears(model)])
        k = int(magnitudes.numel() * options.sparsity)
        if k:
            threshold = torch.kthvalue(magnitudes, k).values
            for module in decoder_linears(model):
                module.weight[module.weight.abs() <= threshold] = 0
    else:
        calib = LayerwiseCalibration(model, windows)
        for _, layer in calib.layers(options.label):
            inputs = calib.capture(layer)
            for name in LINEAR_NAMES:
                module = layer.get_submodule(name)
                x = inputs[name]  # [tokens, in]
                if options.method == "wanda":
                    metric = module.weight.abs() * x.float().pow(2).sum(dim=0).sqrt().unsqueeze(0)
                    module.weight[lowest_mask(metric, options)] = 0
                else:
                    module.weight.copy_(
                        sparsegpt(module.weight, hessian(x), options.sparsity, options.prune_n, options.prune_m)
                    )
            del inputs
    return sparsity_of(model)
