"""How quantized weights are stored in safetensors, and turning them back into fp32 tensors.

For a Linear `P.weight` an integer scheme stores `P.qweight` (uint8; two 4-bit values per byte,
low nibble first, when bits == 4), `P.scales` and `P.qzeros` ([rows, groups], fp32); FP8 stores
`P.weight` as float8 with a per-row `P.weight_scale`. config.json's `quantization_config`
(quant_method "speclm") records the scheme; nothing is inferred from file names. Writing these
files is speclm.compress's business; reading them is the loader's, so the format lives here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

QUANT_METHOD = "speclm"
FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


@dataclass(frozen=True)
class QuantScheme:
    """bits, group_size (0 = one group per output channel) and symmetric or asymmetric."""

    bits: int
    group_size: int = 0
    sym: bool = True

    def __post_init__(self) -> None:
        if not 2 <= self.bits <= 8:
            raise ValueError(f"bits must be in 2..8, got {self.bits}")
        if self.group_size < 0:
            raise ValueError(f"group size must be >= 0 (0 = per channel), got {self.group_size}")

    @property
    def maxq(self) -> int:
        return 2**self.bits - 1

    def num_groups(self, in_features: int) -> int:
        return 1 if self.group_size == 0 else -(-in_features // self.group_size)

    def group_width(self, in_features: int) -> int:
        return in_features if self.group_size == 0 else self.group_size

    def to_dict(self) -> dict:
        return {"bits": self.bits, "group_size": self.group_size, "sym": self.sym}


def expand(params: torch.Tensor, in_features: int, scheme: QuantScheme) -> torch.Tensor:
    """Per-group params [rows, groups] repeated to one per column [rows, in_features]."""
    return params.repeat_interleave(scheme.group_width(in_features), dim=1)[:, :in_features]


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, scheme: QuantScheme) -> torch.Tensor:
    """fp32 weights (q - zero) * scale, [rows, cols]."""
    s, z = expand(scale, q.shape[1], scheme), expand(zero, q.shape[1], scheme)
    return (q.float() - z) * s


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


def dequantize_tensors(tensors: dict[str, torch.Tensor], qconfig: dict, source: str) -> dict[str, torch.Tensor]:
    """fp32 `P.weight` for every stored quantized Linear (the engine's float checkpoint form)."""
    from speclm.models.checkpoint import ModelLoadError  # checkpoint imports the loaders, which import this

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
        out[prefix + ".weight"] = dequantize(
            q, out.pop(prefix + ".scales").float(), out.pop(prefix + ".qzeros").float(), scheme
        )
    return out
