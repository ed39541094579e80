"""The in-memory checkpoint form every loader produces, and building a model from it."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from contextlib import contextmanager
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


def layer_tensor(tensors: dict[str, torch.Tensor], layer: int, name: str) -> torch.Tensor | None:
    return tensors.get(f"model.layers.{layer}.{name}")


FOUR_BIT_GRIDS = ("Q4_0", "Q4_1")  # GGUF types whose grid int4 (group 32) holds exactly


def format_advice(checkpoint: Checkpoint, fmt: WeightFormat) -> str | None:
    """A note when `fmt` needlessly loses precision the file has: int8 requantizes a GGUF's Q4_0/Q4_1
    layers onto one scale per output channel, off their per-32 grid, while int4 keeps that grid
    exactly (and runs faster). Measured on SmolLM2-135M Q4_1, 4 Spec-Bench prompts: the int8 grid
    alone (with fp32 activations) made greedy output leave the file's own (fp32) numbers after
    0/5/49/21 tokens, the int8 runtime after 0/2/46/21, so the weights, not bf16 activations, are
    what drifts."""
    types = checkpoint.metadata.get("gguf_tensor_types") or {}
    layers = [t for name, t in types.items() if name.startswith("model.layers.") and name.endswith("proj.weight")]
    four_bit = [t for t in layers if t in FOUR_BIT_GRIDS]
    if fmt.name != "int8" or not layers or len(four_bit) < len(layers) / 2:
        return None
    return (
        f"--weights int8 requantizes this file's {len(four_bit)} {'/'.join(sorted(set(four_bit)))} layer tensors "
        "per output channel, off their per-32 grid; --weights int4 keeps that grid exactly and is faster"
    )


@functools.cache
def _libc():
    """glibc, or None (another C library: the two calls below then do nothing)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def return_big_frees_to_os(threshold: int = 1 << 20) -> None:
    """Serve allocations of >= 1 MB by mmap, so freeing them returns the memory to the OS at once.
    glibc otherwise raises its mmap threshold after the first big frees, and loading's per-layer fp32
    temporaries then stay in the heap, raising peak RSS. (Process-wide. Per decoded token nothing
    this big is allocated; a verification pass over many rows, whose logits pass 1 MB, pays one mmap.)"""
    libc = _libc()
    if libc is not None:
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD


def trim_freed_memory() -> None:
    """Give the heap's free pages back to the OS (after loading)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@contextmanager
def single_threaded():
    """Run torch ops on one thread for a while. Loading is many small elementwise ops, and on a busy
    machine each multi-threaded op can stall for tens of milliseconds waiting for its other threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
