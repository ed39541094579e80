"""SparseGPT (Frantar & Alistarh 2023): prune columns in order, choosing the mask per block by the
OBS saliency w^2 / [H^-1]_jj and spreading each pruned weight's error through the inverse Hessian."""

from __future__ import annotations

import torch

from speclm.compress.gptq import prepare_inverse_hessian


def sparsegpt(
    weight: torch.Tensor,  # [rows, cols]
    h: torch.Tensor,  # [cols, cols]
    sparsity: float,
    prune_n: int = 0,
    prune_m: int = 0,
    block_size: int = 128,
    percdamp: float = 0.01,
) -> torch.Tensor:
    """The pruned, error-compensated weight [rows, cols]: `sparsity` of each row's block zeroed
    (unstructured), or N of every M consecutive inputs zeroed when prune_n/prune_m are set."""
    w = weight.detach().float().clone()
    rows, cols = w.shape
    h_inv = prepare_inverse_hessian(h, w, percdamp)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        count = i2 - i1
        w1 = w[:, i1:i2].clone()
        q1 = torch.zeros_like(w1)
        err1 = torch.zeros_like(w1)
        h_inv1 = h_inv[i1:i2, i1:i2]
        mask1 = torch.zeros_like(w1, dtype=torch.bool)  # True = pruned
        if not prune_n:
            saliency = w1.pow(2) / torch.diag(h_inv1).reshape(1, -1).pow(2)
            k = int(count * sparsity)
            if k:  # the same count in every row, like Wanda's per-output comparison groups
                mask1.scatter_(1, torch.topk(saliency, k, dim=1, largest=False)[1], True)
        for i in range(count):
            w_col = w1[:, i]
            d = h_inv1[i, i]
            if prune_n and i % prune_m == 0:
                saliency = w1[:, i : i + prune_m].pow(2) / torch.diag(h_inv1)[i : i + prune_m].reshape(1, -1).pow(2)
                mask1.scatter_(1, i + torch.topk(saliency, prune_n, dim=1, largest=False)[1], True)
            q = w_col.clone()
            q[mask1[:, i]] = 0
            q1[:, i] = q
            err = (w_col - q) / d
            w1[:, i:] -= err.unsqueeze(1) @ h_inv1[i, i:].unsqueeze(0)
            err1[:, i] = err
        w[:, i1:i2] = q1
        w[:, i2:] -= err1 @ h_inv[i1:i2, i2:]
    return w
