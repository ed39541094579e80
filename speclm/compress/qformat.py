"""How quantized weights are stored in safetensors, and turning them back into fp32 tensors.

For a Linear `P.weight` an integer scheme stores `P.qweight` (uint8; two 4-bit values per byte,
low nibble first, when bits == 4), `P.scales` and `P.qzeros` ([rows, groups], fp32); FP8 stores
`P.weight` as float8 with a per-row `P.weight_scale`. config.json's `quantization_config`
(quant_method "speclm") records the scheme; nothing is inferred from file names.
"""
from __future__ import annotations

import torch

from speclm.compress.rtn import QuantizedWeight, QuantScheme, dequantize

QUANT_METHOD = "speclm"
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """uint8 storage of q [rows, cols]: nibble pairs for 4 bits (cols even), one value per byte otherwise."""
    if bits == 4 and q.shape[1] % 2 == 0:
        return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    return q.contiguous()


def unpack(packed: torch.Tensor, bits: int, cols: int) -> torch.Tensor:
    """Inverse of pack: q [rows, cols] uint8."""
    if bits == 4 and packed.shape[1] * 2 == cols:
        q = torch.empty(packed.shape[0], cols, dtype=torch.uint8)
        q[:, 0::2] = packed & 0x0F
        q[:, 1::2] = packed >> 4
        return q
    return packed


def int_tensors(prefix: str, qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """The stored tensors of one integer-quantized Linear weight."""
    return {
        f"{prefix}.qweight": pack(qw.q, qw.scheme.bits),
        f"{prefix}.scales": qw.scale.float().contiguous(),
        f"{prefix}.qzeros": qw.zero.to(torch.uint8).contiguous(),
    }


def fp8_quantize(w: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row scaled FP8 weights: (w8 [rows, cols] float8, scale [rows, 1]); w ~ w8.float() * scale."""
    dtype = FP8_DTYPES[fmt]
    scale = (w.abs().amax(dim=1, keepdim=True) / torch.finfo(dtype).max).clamp(min=1e-12)
    return (w / scale).to(dtype), scale.float()


def dequantize_tensors(tensors: dict[str, torch.Tensor], qconfig: dict, source: str) -> dict[str, torch.Tensor]:
    """fp32 `P.weight` for every stored quantized Linear (the engine's float checkpoint form)."""
    from speclm.models.checkpoint import ModelLoadError

    if qconfig.get("quant_method") != QUANT_METHOD:
        raise ModelLoadError(f"{source}: unsupported quantization_config quant_method {qconfig.get('quant_method')!r}")
    out = dict(tensors)
    if qconfig.get("format") == "fp8":
        for name in [k for k in tensors if k.endswith(".weight_scale")]:
            prefix = name[: -len(".weight_scale")]
            out[prefix + ".weight"] = tensors[prefix + ".weight"].float() * out.pop(name).float()
        return out
    scheme = QuantScheme(qconfig["bits"], qconfig["group_size"], qconfig["sym"])
    for name in [k for k in tensors if k.endswith(".qweight")]:
        prefix = name[: -len(".qweight")]
        cols = qconfig["in_features"][prefix.rsplit(".", 1)[-1]]
        q = unpack(out.pop(name), scheme.bits, cols)
        out[prefix + ".weight"] = dequantize(q, out.pop(prefix + ".scales").float(), out.pop(prefix + ".qzeros").float(), scheme)
    return out
