"""The in-memory checkpoint form every loader produces, and the advice against a weight format that
needlessly loses the precision of its file."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from speclm.config import WeightFormat
from speclm.models.config import ModelConfig


class ModelLoadError(ValueError):
    """A model file is missing, corrupt, or describes something speclm cannot run."""


class TensorDict(dict):
    """Float tensors by name, with the shape_of that lazily loading mappings (GGUF) also offer."""

    def shape_of(self, name: str) -> tuple[int, ...]:
        return tuple(self[name].shape)


@dataclass
class Checkpoint:
    """Weights under Hugging Face tensor names (model.layers.N.self_attn.q_proj.weight, ...), fp32: a
    dict (made a TensorDict) or a mapping that loads lazily and has shape_of (GGUF's LazyTensors)."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    source: str
    metadata: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if type(self.tensors) is dict:
            self.tensors = TensorDict(self.tensors)


FOUR_BIT_GRIDS = ("Q4_0", "Q4_1")  # GGUF types whose grid int4 (group 32) holds exactly


def format_advice(checkpoint: Checkpoint, fmt: WeightFormat) -> str | None:
    """A note when `fmt` needlessly loses precision the file has: int8 requantizes a GGUF's Q4_0/Q4_1
    layers onto one scale per output channel, off their per-32 grid, while int4 keeps that grid
    exactly (and runs faster). The requantized weights, not the bf16 activations, are what makes
    greedy output leave the file's own numbers."""
    types = checkpoint.metadata.get("gguf_tensor_types") or {}
    layers = [t for name, t in types.items() if name.startswith("model.layers.") and name.endswith("proj.weight")]
    four_bit = [t for t in layers if t in FOUR_BIT_GRIDS]
    if fmt.name != "int8" or not layers or len(four_bit) < len(layers) / 2:
        return None
    return (
        f"--weights int8 requantizes this file's {len(four_bit)} {'/'.join(sorted(set(four_bit)))} layer tensors "
        "per output channel, off their per-32 grid; --weights int4 keeps that grid exactly and is faster"
    )
