"""The runtime weight format's layer: make_linear picks the layer per format, head_format the lm_head's
(int4's is w8a8: speclm/models/w8a8_linear.py), convert_linear_layers converts a whole model."""

from __future__ import annotations

import torch
from torch import nn

from speclm.config import WeightFormat
from speclm.models.linear import Linear
from speclm.models.quant_linear import BF16Linear, Int4Linear, Int8Linear
from speclm.models.w8a8_linear import W8A8Linear, w8a8_supported


def make_linear(weight: torch.Tensor, bias: torch.Tensor | None, fmt: WeightFormat) -> nn.Module:
    """A linear layer in format `fmt` computing x @ weight.T + bias (weight [out, in])."""
    if fmt.name == "fp32":
        layer = Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        layer.weight = nn.Parameter(weight.detach(), requires_grad=False)  # dtype kept as given
        if bias is not None:
            layer.bias = nn.Parameter(bias.detach(), requires_grad=False)
        return layer
    if fmt.name == "bf16":
        return BF16Linear(weight, bias)
    if fmt.name == "int8":
        return Int8Linear(weight, bias)
    if fmt.name == "w8a8":
        return W8A8Linear(weight, bias)
    if fmt.name == "int4":
        return Int4Linear(weight, bias, fmt.group_size)
    if fmt.name == "q4_0":
        from speclm.models.gguf_weights import GGUFLinear, quantized_segment

        if weight.shape[1] % 32:  # Q4_0 blocks are 32 inputs wide: such a layer (tiny models) stays fp32
            return make_linear(weight.float(), bias, WeightFormat("fp32"))
        return GGUFLinear([quantized_segment(weight, "Q4_0")], weight.shape[1], bias)
    raise ValueError(f"make_linear: no layer for weight format {fmt.label!r}")


def head_format(fmt: WeightFormat) -> WeightFormat:
    """The lm_head's format under `fmt`: int4 models get a w8a8 head (int8 weights and per-row int8
    activations). GGUF heads and embeddings are usually 8-bit, and 4 bits lose too much of them,
    while the w8a8 kernel reads the head at memory speed (benchmarks/kernels/). Torch builds
    without fbgemm (ARM) keep the int8 weight-only head. q4_0 heads are w8a8 for the same reason."""
    if fmt.name not in ("int4", "q4_0"):
        return fmt
    return WeightFormat("w8a8") if w8a8_supported() else WeightFormat("int8")


def convert_linear_layers(model: nn.Module, weights: str | WeightFormat, include_lm_head: bool = True) -> nn.Module:
    """Replace every nn.Linear of `model` (in place) by the runtime format `weights`, one at a time
    so that only one fp32 weight is alive beyond the model's own. The lm_head is converted too
    (its weight may be tied to the embedding, which keeps its fp32 table for exact lookups)."""
    fmt = WeightFormat.parse(weights)
    if fmt.name in ("fp32", "auto"):  # auto: file types are kept at load; anything added later stays fp32
        return model
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and (include_lm_head or not name.endswith("lm_head"))
    ]
    for name, module in targets:
        parent_name, _, attr = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        layer_format = head_format(fmt) if name.endswith("lm_head") else fmt
        setattr(
            parent,
            attr,
            make_linear(module.weight.data, None if module.bias is None else module.bias.data, layer_format),
        )
    return model
