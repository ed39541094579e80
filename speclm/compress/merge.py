"""Model merging on tensors: linear (model soups), task arithmetic, TIES, DARE and SLERP."""

from __future__ import annotations

import torch


def linear(tensors: list[torch.Tensor], weights: list[float], normalize: bool = True) -> torch.Tensor:
    """Weighted average (a model soup); without normalize, the plain weighted sum."""
    total = sum(w * t for w, t in zip(weights, tensors))
    return total / sum(weights) if normalize else total


def task_arithmetic(
    base: torch.Tensor, tensors: list[torch.Tensor], weights: list[float], scale: float = 1.0
) -> torch.Tensor:
    """base + scale * sum_i w_i (t_i - base): add the task vectors to the base."""
    return base + scale * sum(w * (t - base) for w, t in zip(weights, tensors))


def trim(delta: torch.Tensor, density: float) -> torch.Tensor:
    """TIES step 1: keep the `density` fraction of entries with the largest magnitude, zero the rest."""
    k = int(round(delta.numel() * density))
    if k >= delta.numel():
        return delta
    out = torch.zeros_like(delta)
    if k > 0:
        idx = torch.topk(delta.abs().flatten(), k).indices
        out.view(-1)[idx] = delta.flatten()[idx]
    return out


def elect_sign(deltas: torch.Tensor) -> torch.Tensor:
    """TIES step 2: per entry, the sign of the summed (weighted, trimmed) deltas [models, ...] -> [...]."""
    return torch.sign(deltas.sum(dim=0))


def disjoint_merge(deltas: torch.Tensor, weights: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """TIES step 3: weighted mean over the models whose delta agrees with the elected sign (zeros don't vote)."""
    agree = (torch.sign(deltas) == sign.unsqueeze(0)) & (deltas != 0)  # [models, ...]
    w = weights.view(-1, *[1] * sign.dim()) * agree
    return (w * deltas).sum(dim=0) / w.sum(dim=0).clamp(min=1e-12)


def ties(
    base: torch.Tensor, tensors: list[torch.Tensor], weights: list[float], density: float, scale: float = 1.0
) -> torch.Tensor:
    """TIES-merging (Yadav et al. 2023): trim each task vector, elect a sign, average the agreeing ones."""
    deltas = torch.stack([trim(t - base, density) for t in tensors])  # [models, ...]
    w = torch.tensor(weights, dtype=deltas.dtype)
    weighted = deltas * w.view(-1, *[1] * base.dim())
    return base + scale * disjoint_merge(deltas, w, elect_sign(weighted))


def dare_drop(delta: torch.Tensor, density: float, generator: torch.Generator) -> torch.Tensor:
    """DARE (Yu et al. 2023): drop each entry with probability 1 - density, rescale survivors by 1/density
    (so the expectation of the delta is unchanged)."""
    if density >= 1:
        return delta
    keep = torch.rand(delta.shape, generator=generator) < density
    return torch.where(keep, delta / density, torch.zeros_like(delta))


def dare(
    base: torch.Tensor,
    tensors: list[torch.Tensor],
    weights: list[float],
    density: float,
    generator: torch.Generator,
    use_ties: bool = False,
    scale: float = 1.0,
) -> torch.Tensor:
    """Drop-and-rescale each task vector, then add them (dare_linear) or TIES-merge them (dare_ties)."""
    deltas = torch.stack([dare_drop(t - base, density, generator) for t in tensors])
    w = torch.tensor(weights, dtype=deltas.dtype)
    if not use_ties:
        return base + scale * (deltas * w.view(-1, *[1] * base.dim())).sum(dim=0)
    weighted = deltas * w.view(-1, *[1] * base.dim())
    return base + scale * disjoint_merge(deltas, w, elect_sign(weighted))


def slerp(a: torch.Tensor, b: torch.Tensor, t: float, eps: float = 1e-8) -> torch.Tensor:
    """Spherical interpolation between a (t=0) and b (t=1) along the great circle of their directions;
    nearly parallel tensors fall back to linear interpolation (the arc is a line there)."""
    a64, b64 = a.double().flatten(), b.double().flatten()
    dot = torch.dot(a64 / (a64.norm() + eps), b64 / (b64.norm() + eps)).clamp(-1, 1)
    if dot.abs() > 0.9995:
        return ((1 - t) * a64 + t * b64).view(a.shape).to(a.dtype)
    theta = torch.arccos(dot)
    sin_theta = torch.sin(theta)
    out = (torch.sin((1 - t) * theta) / sin_theta) * a64 + (torch.sin(t * theta) / sin_theta) * b64
    return out.view(a.shape).to(a.dtype)
