"""Weight quantizers shared by the runtime formats: pure functions on fp32 [out, in] weights."""

from __future__ import annotations

import torch

# The quantized kernels below are fast with bf16 activations and much slower with fp32 ones on
# this torch build (measured), so every non-fp32 format computes its matmul in bf16.
COMPUTE_DTYPE = torch.bfloat16

ROW_CHUNK = 4096  # quantize this many output rows at a time: bounds the fp32 temporaries (peak RSS)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: (q int8 [out, in], scales [out]) with w ~= q * scale.
    Scales are rounded to the compute dtype first so that q is chosen for the scale actually used."""
    if weight.shape[0] > ROW_CHUNK:
        parts = [quantize_int8(chunk) for chunk in weight.split(ROW_CHUNK)]
        return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    absmax = weight.abs().amax(dim=1).clamp(min=1e-12)
    scales = (absmax / 127.0).to(COMPUTE_DTYPE).float()
    q = torch.round(weight / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scales


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of `group_size` inputs: (q uint8 in 0..15 [out, in], scales, mins
    [out, in/group]) with w ~= q * scale + min.

    For weights that came from GGUF Q4_1 (group 32, w = d*q + m with q spanning 0..15 in every
    block) the grid found is the file's own (d, m), so the only loss is rounding d and m to the
    bf16 the kernel stores; q is then re-chosen as the nearest point of that rounded grid."""
    out_features, in_features = weight.shape
    if out_features > ROW_CHUNK and in_features % group_size == 0:
        parts = [quantize_int4(chunk, group_size) for chunk in weight.split(ROW_CHUNK)]
        return tuple(torch.cat([p[i] for p in parts]) for i in range(3))
    if in_features % group_size:
        raise ValueError(
            f"int4 group size {group_size} does not divide the layer's input size {in_features}; "
            "use a smaller --weights int4:GROUP"
        )
    groups = weight.reshape(out_features, in_features // group_size, group_size)
    lo, hi = groups.amin(dim=-1), groups.amax(dim=-1)  # [out, groups]
    scales = ((hi - lo) / 15.0).clamp(min=1e-12)
    # The kernel stores scale and zero = min + 8*scale in bf16; quantize against those values.
    scales = scales.to(COMPUTE_DTYPE).float()
    zeros = (lo + 8 * scales).to(COMPUTE_DTYPE).float()
    mins = zeros - 8 * scales
    q = torch.round((groups - mins[..., None]) / scales[..., None]).clamp_(0, 15).to(torch.uint8)
    return q.reshape(out_features, in_features), scales, mins
