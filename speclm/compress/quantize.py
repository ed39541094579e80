"""The quantization driver: a method name -> a model with quantized decoder Linears, and the
tensors + quantization_config that store it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speclm.compress.awq import awq_scale_layer
from speclm.compress.calibration import LINEAR_NAMES, LayerwiseCalibration, hessian
from speclm.compress.gptq import gptq
from speclm.compress.model_io import FUSED_LINEARS, model_to_tensors, split_fused
from speclm.compress.qformat import fp8_quantize, int_tensors
from speclm.compress.rtn import QuantizedWeight, QuantScheme, rtn
from speclm.compress.smoothquant import smooth_layer
from speclm.models.llama import LlamaModel
from speclm.models.qformat import QUANT_METHOD

# method -> (algorithm, bits or fp8 format, default group size, default symmetric)
METHODS = {
    "rtn-int8": ("rtn", 8, 0, True),
    "rtn-int4": ("rtn", 4, 128, False),
    "rtn-int3": ("rtn", 3, 128, False),
    "gptq-int4": ("gptq", 4, 128, False),
    "gptq-int3": ("gptq", 3, 128, False),
    "awq-int4": ("awq", 4, 128, False),
    "awq-int3": ("awq", 3, 128, False),
    "qat-int4": ("qat", 4, 128, False),
    "smoothquant-w8a8": ("smoothquant", 8, 0, True),
    "fp8-e4m3": ("fp8", "e4m3", 0, True),
    "fp8-e5m2": ("fp8", "e5m2", 0, True),
}
CALIBRATED = ("gptq", "awq", "smoothquant", "qat")


@dataclass
class QuantizeOptions:
    """Method plus overrides; None keeps the method's default group size / symmetry."""

    method: str
    group_size: int | None = None
    sym: bool | None = None
    act_order: bool = True  # GPTQ: columns by descending Hessian diagonal (static groups: no runtime cost)
    percdamp: float = 0.01
    alpha: float = 0.5  # SmoothQuant migration strength
    qat_steps: int = 50  # QAT: training windows (one optimizer step each)
    qat_lr: float = 1e-4
    seed: int = 0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"unknown quantization method {self.method!r}; choose from {', '.join(METHODS)}")

    @property
    def algorithm(self) -> str:
        return METHODS[self.method][0]

    @property
    def needs_calibration(self) -> bool:
        return self.algorithm in CALIBRATED

    def scheme(self) -> QuantScheme:
        _, bits, group, sym = METHODS[self.method]
        return QuantScheme(
            bits, group if self.group_size is None else self.group_size, sym if self.sym is None else self.sym
        )


@dataclass
class QuantizeResult:
    """The model with fake-quantized weights (ready to evaluate) and what to store."""

    model: LlamaModel
    tensors: dict[str, torch.Tensor]
    quantization_config: dict
    calibration: dict = field(default_factory=dict)


def _set_weight(module: torch.nn.Linear, qw: QuantizedWeight) -> None:
    with torch.no_grad():
        module.weight.copy_(qw.dequantize())


@torch.no_grad()
def quantize_model(model: LlamaModel, options: QuantizeOptions, windows: torch.Tensor | None = None) -> QuantizeResult:
    """Quantize every decoder Linear of `model` in place (embeddings, norms and lm_head stay fp32)."""
    algorithm = options.algorithm
    if options.needs_calibration and windows is None:
        raise ValueError(f"{options.method} needs calibration text (--calib-text)")
    if algorithm == "fp8":
        return _quantize_fp8(model, METHODS[options.method][1])
    scheme = options.scheme()
    quantized: dict[tuple[int, str], QuantizedWeight] = {}
    if algorithm == "qat":
        from speclm.compress.qat import quantization_aware_training

        quantization_aware_training(model, windows, scheme, options.qat_steps, options.qat_lr, options.seed)
    if algorithm in ("rtn", "qat"):
        for i, layer in enumerate(model.layers):
            for name in LINEAR_NAMES:
                module = layer.get_submodule(name)
                quantized[i, name] = rtn(module.weight, scheme)
                _set_weight(module, quantized[i, name])
    else:
        calib = LayerwiseCalibration(model, windows)
        for i, layer in calib.layers(options.method):
            inputs = calib.capture(layer)
            if algorithm == "awq":
                awq_scale_layer(layer, inputs, scheme)
            elif algorithm == "smoothquant":
                smooth_layer(layer, inputs, options.alpha)
            for name in LINEAR_NAMES:
                module = layer.get_submodule(name)
                if algorithm == "gptq":
                    qw = gptq(
                        module.weight,
                        hessian(inputs[name]),
                        scheme,
                        percdamp=options.percdamp,
                        act_order=options.act_order,
                    )
                else:
                    qw = rtn(module.weight, scheme)
                quantized[i, name] = qw
                _set_weight(module, qw)
            del inputs
    return QuantizeResult(model, _int_checkpoint_tensors(model, quantized), _int_config(model, options, scheme))


def _int_checkpoint_tensors(
    model: LlamaModel, quantized: dict[tuple[int, str], QuantizedWeight]
) -> dict[str, torch.Tensor]:
    """HF-named tensors with each quantized Linear's weight replaced by its stored integer form."""
    tensors = model_to_tensors(model)
    for (i, fused), qw in quantized.items():
        parts = zip(*(split_fused(model, fused, t).items() for t in (qw.q, qw.scale, qw.zero)))
        for (name, q), (_, scale), (_, zero) in parts:
            prefix = f"model.layers.{i}.{name}"
            del tensors[prefix + ".weight"]
            tensors.update(int_tensors(prefix, QuantizedWeight(q, scale, zero, qw.scheme)))
    return tensors


def _in_features(model: LlamaModel) -> dict[str, int]:
    layer = model.layers[0]
    return {
        name.rsplit(".", 1)[-1]: layer.get_submodule(fused).weight.shape[1]
        for fused, names in FUSED_LINEARS.items()
        for name in names
    }


def _int_config(model: LlamaModel, options: QuantizeOptions, scheme: QuantScheme) -> dict:
    cfg = {
        "quant_method": QUANT_METHOD,
        "method": options.method,
        "format": "int",
        **scheme.to_dict(),
        "packing": "uint8, 4-bit values two per byte (low nibble first)" if scheme.bits == 4 else "uint8",
        "in_features": _in_features(model),
        "modules": "decoder linears (q,k,v,o,gate,up,down)",
    }
    if options.algorithm == "gptq":
        cfg.update(act_order=options.act_order, percdamp=options.percdamp)
    if options.algorithm == "qat":
        cfg.update(qat_steps=options.qat_steps, qat_lr=options.qat_lr)
    if options.algorithm == "smoothquant":
        cfg.update(alpha=options.alpha, act_bits=8, act_granularity="per-token dynamic symmetric")
    return cfg


@torch.no_grad()
def _quantize_fp8(model: LlamaModel, fmt: str) -> QuantizeResult:
    """FP8 weights with one scale per output row (simulated: the engine computes in fp32)."""
    stored: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    for i, layer in enumerate(model.layers):
        for name in LINEAR_NAMES:
            module = layer.get_submodule(name)
            w8, scale = fp8_quantize(module.weight.detach(), fmt)
            stored[i, name] = (w8, scale)
            with torch.no_grad():
                module.weight.copy_(w8.float() * scale)
    tensors = model_to_tensors(model)
    for (i, fused), (w8, scale) in stored.items():
        for (name, w_part), (_, s_part) in zip(
            split_fused(model, fused, w8).items(), split_fused(model, fused, scale).items()
        ):
            prefix = f"model.layers.{i}.{name}"
            tensors[prefix + ".weight"] = w_part.contiguous()
            tensors[prefix + ".weight_scale"] = s_part.contiguous()
    config = {
        "quant_method": QUANT_METHOD,
        "method": f"fp8-{fmt}",
        "format": "fp8",
        "fp8_format": fmt,
        "granularity": "per output channel",
        "modules": "decoder linears (q,k,v,o,gate,up,down)",
    }
    return QuantizeResult(model, tensors, config)
