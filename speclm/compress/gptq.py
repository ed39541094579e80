"""GPTQ (Frantar et al. 2022): quantize columns in order, spreading each one's error over the
not-yet-quantized columns through the inverse Hessian of the layer's inputs."""

from __future__ import annotations

import torch

from speclm.compress.rtn import (
    Fit,
    QuantizedWeight,
    QuantScheme,
    find_params,
    from_fake_quant,
    group_params,
    quantize_column,
)


def prepare_inverse_hessian(h: torch.Tensor, w: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Upper Cholesky factor of H^-1 [cols, cols], with dead inputs fixed and dampening added.
    Edits `w` in place: weights of inputs that never fire are zeroed (they cannot matter)."""
    h = h.clone().double()
    dead = torch.diag(h) == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h += percdamp * torch.mean(torch.diag(h)) * torch.eye(h.shape[0], dtype=h.dtype)
    h_inv = torch.cholesky_inverse(torch.linalg.cholesky(h))
    return torch.linalg.cholesky(h_inv, upper=True).float()


def gptq(
    weight: torch.Tensor,  # [rows, cols]
    h: torch.Tensor,  # [cols, cols]
    scheme: QuantScheme,
    block_size: int = 128,
    percdamp: float = 0.01,
    act_order: bool = False,
    fit: Fit = find_params,
) -> QuantizedWeight:
    """Quantize `weight` minimising ||(W - Q) X||^2 for inputs with Hessian `h`.

    Lazy batch updates: columns are processed in blocks, the error of a block is applied to the
    remaining columns in one matmul. With act_order, columns go in descending Hessian-diagonal
    order and group params are fitted up front on the original weights ("static groups"), so the
    stored groups stay contiguous in the original column order. `fit` gives a group's scale and zero
    (default: the min/max fit of `find_params`).
    """
    w = weight.detach().float().clone()
    rows, cols = w.shape
    perm = torch.argsort(torch.diag(h), descending=True) if act_order else torch.arange(cols)
    h = h[perm][:, perm]
    w = w[:, perm]
    h_inv = prepare_inverse_hessian(h, w, percdamp)
    width = scheme.group_width(cols)
    static = act_order or scheme.group_size == 0
    if static:
        scale, zero = group_params(w[:, torch.argsort(perm)], scheme, fit)  # in original column order
    else:
        scale = torch.zeros(rows, scheme.num_groups(cols))
        zero = torch.zeros_like(scale)
        if block_size % width:
            block_size = width  # groups must not straddle blocks: their params come from updated weights
    q_all = torch.zeros_like(w)
    for i1 in range(0, cols, block_size):
        i2 = min(i1 + block_size, cols)
        w1 = w[:, i1:i2].clone()
        q1 = torch.zeros_like(w1)
        err1 = torch.zeros_like(w1)
        h_inv1 = h_inv[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if not static and col % width == 0:
                g = col // width
                scale[:, g], zero[:, g] = fit(w1[:, i : i + width], scheme)
            g = int(perm[col]) // width
            q = quantize_column(w1[:, i], scale[:, g], zero[:, g], scheme.maxq)
            q1[:, i] = q
            err = (w1[:, i] - q) / h_inv1[i, i]
            w1[:, i:] -= err.unsqueeze(1) @ h_inv1[i, i:].unsqueeze(0)
            err1[:, i] = err
        q_all[:, i1:i2] = q1
        w[:, i2:] -= err1 @ h_inv[i1:i2, i2:]
    w_hat = q_all[:, torch.argsort(perm)]
    return from_fake_quant(w_hat, scale, zero, scheme)
