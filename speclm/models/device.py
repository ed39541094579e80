"""Which device a model runs on: `--device auto|cpu|cuda[:N]` resolved to a torch.device, and the float
dtype a GPU computes in."""

from __future__ import annotations

import torch

DEVICE_HELP = "auto (a CUDA GPU when torch sees one, else the CPU) | cpu | cuda | cuda:N"


def resolve_device(value: str | torch.device | None = "auto") -> torch.device:
    """The torch.device that `value` names; `auto` (or None) takes the first CUDA GPU when torch sees
    one, else the CPU. Raises ValueError for a malformed value or a CUDA device this machine lacks."""
    if isinstance(value, torch.device):
        value = str(value)
    text = "auto" if value is None else str(value).strip().lower()
    if text == "auto":
        return torch.device("cuda:0") if torch.cuda.is_available() else torch.device("cpu")
    if text == "cpu":
        return torch.device("cpu")
    kind, _, index = text.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise ValueError(f"unknown device {value!r}; expected {DEVICE_HELP}")
    if not torch.cuda.is_available():
        raise ValueError(f"device {value!r} asked for, but torch sees no CUDA GPU here (torch {torch.__version__})")
    number = int(index or 0)
    if number >= torch.cuda.device_count():
        raise ValueError(f"device {value!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    return torch.device("cuda", number)


def gpu_dtype(device: torch.device) -> torch.dtype:
    """The half-precision dtype weights take on `device`: bf16 where the GPU computes it, else fp16."""
    return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16


def describe(device: torch.device) -> str:
    """The device for a stage line: `cpu`, or `cuda:0 (NVIDIA H100 80GB HBM3)`."""
    if device.type != "cuda":
        return str(device)
    return f"{device} ({torch.cuda.get_device_name(device)})"


def column_major_weights(model: torch.nn.Module) -> None:
    """Store every linear layer's weight [out, in] column-major (its transpose [in, out] contiguous): cuBLAS
    then runs x @ W^T as a plain product, whose kernels read a decoding step's few rows' weights faster on
    an H100 than the transposed product's (benchmarks/cuda/step_timeline_h100.md). The values, shapes and
    every op on them stay the same; a tied head's embedding table is the same tensor."""
    seen = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            module.weight.data = module.weight.data.t().contiguous().t()
