"""The two sources of a decoder's layers: float tensors converted to an explicit runtime format
(FloatSource), or a GGUF file's tensors repacked on their own grids straight from its bytes
(NativeSource)."""

from __future__ import annotations

import torch
from torch import nn

from speclm.config import WeightFormat
from speclm.models.checkpoint import Checkpoint
from speclm.models.gguf_weights import (
    NATIVE_TYPES,
    NO_ORDER,
    GGUFEmbedding,
    GGUFLinear,
    PackArena,
    Segment,
    native_kernels,
    quantized_segment,
)
from speclm.models.pack_cache import MappedArena
from speclm.models.weight_formats import head_format, make_linear


class FloatSource:
    """Layers from float tensors (dequantized GGUF, safetensors, llama2.c) in an explicit format."""

    def __init__(self, checkpoint: Checkpoint, fmt: WeightFormat, dtype: torch.dtype, device: str) -> None:
        self.t, self.fmt, self.dtype, self.device = checkpoint.tensors, fmt, dtype, device

    def tensor(self, name: str) -> torch.Tensor:
        return self.t[name].to(device=self.device, dtype=self.dtype)

    def linear(self, names: list[str], bias: torch.Tensor | None, head: bool = False) -> nn.Module:
        weight = torch.cat([self.tensor(n) for n in names]) if len(names) > 1 else self.tensor(names[0])
        if bias is not None and self.fmt.name == "fp32" and bias.dtype != self.dtype:  # (a GPU's bf16 layers)
            bias = bias.to(self.dtype)
        return make_linear(weight, bias, head_format(self.fmt) if head else self.fmt)

    def embedding(self, name: str) -> nn.Module:
        weight = self.tensor(name)
        module = nn.Embedding(*weight.shape, device="meta")
        module.weight = nn.Parameter(weight, requires_grad=False)
        return module

    def tied_head(self, embedding: nn.Module) -> nn.Module:
        if self.fmt.name == "fp32":  # the same tensor; a quantized head keeps its own copy, the lookup stays exact
            head = make_linear(embedding.weight, None, self.fmt)
            head.weight = embedding.weight
            return head
        return make_linear(embedding.weight, None, head_format(self.fmt))


SLICE_BYTES = 16 << 20  # file bytes read and repacked at a time


class NativeSource:
    """Layers on a GGUF file's own grids, repacked tensor by tensor from the file's bytes (no float copy
    of the model); tensors of other types (F32, F16, ...) become fp32 layers. With `to_q4_0` the decoder
    layers' linear tensors and an output head of its own are re-quantized to Q4_0 (a draft's coarser
    weights) straight from the file's bytes; the embedding (and so a tied head) keeps its type."""

    def __init__(
        self,
        checkpoint: Checkpoint,
        to_q4_0: bool = False,
        arena: PackArena | MappedArena | None = None,
    ) -> None:
        self.t = checkpoint.tensors  # speclm.models.gguf_loader.LazyTensors
        self.to_q4_0 = to_q4_0
        self.floats = FloatSource(checkpoint, WeightFormat("fp32"), torch.float32, "cpu")
        self._scratch = torch.empty(0, dtype=torch.uint8)  # file bytes of the tensor being repacked
        self._converted = torch.empty(0, dtype=torch.uint8)  # its bytes as Q4_0 (to_q4_0)
        # Where packed tensors go; a mapped cache entry's arena hands them out already packed.
        self.arena = arena if arena is not None else PackArena()

    def tensor(self, name: str) -> torch.Tensor:
        return self.t[name]

    def _part(self, name: str, to_q4_0: bool = False) -> Segment | torch.Tensor:
        """One tensor repacked (the rotary rows of q and k in their rotary order)."""
        type_name = self.t.type_name(name)
        if type_name not in NATIVE_TYPES:
            return quantized_segment(self.t[name], "Q4_0") if to_q4_0 else self.t[name]
        kernels, rows = native_kernels(), self.t.rows_of(name)
        row_bytes = self.t.byte_size(name) // rows
        out_type = "Q4_0" if to_q4_0 else type_name
        out_row_bytes = self.t.shape_of(name)[1] // 32 * 18 if out_type != type_name else row_bytes
        out = self.arena.take(kernels.gguf_packed_bytes(NATIVE_TYPES[out_type], rows, out_row_bytes))
        if self.arena.filled:
            return Segment(out_type, out, rows)
        # Rows are read a slice at a time, so the scratch stays small: fresh memory is costly to touch
        # (a page fault per page), and a large tensor (an embedding, a head) would need that much more.
        step = max(16, SLICE_BYTES // row_bytes // 16 * 16)
        order = self.t.rotary_row_order(name)
        if order is not None:  # a permutation (the rotary rows of q and k): read whole
            step = rows
        for first in range(0, rows, step):
            raw = self._read(name, first, min(rows, first + step), row_bytes)
            if out_type != type_name:
                raw = self._to_q4_0(raw, type_name)
            kernels.gguf_pack(raw, NATIVE_TYPES[out_type], NO_ORDER if order is None else order, out, first)
        return Segment(out_type, out, rows)

    def _to_q4_0(self, raw: torch.Tensor, type_name: str) -> torch.Tensor:
        """Rows of file bytes re-quantized to Q4_0, in the reused conversion scratch."""
        if self._converted.numel() < raw.numel():  # (Q4_0 takes no more bytes than any type converted to it)
            self._converted = native_kernels().huge_page_buffer(raw.numel())
        return native_kernels().gguf_to_q4_0(raw, NATIVE_TYPES[type_name], self._converted)

    def _read(self, name: str, first: int, end: int, row_bytes: int) -> torch.Tensor:
        """The file's rows [first, end) of a tensor, in the reused scratch."""
        if self._scratch.numel() < (end - first) * row_bytes:
            self._scratch = native_kernels().huge_page_buffer((end - first) * row_bytes)
        return self.t.raw(name, self._scratch, (first, end))

    def linear(self, names: list[str], bias: torch.Tensor | None, head: bool = False) -> nn.Module:
        in_features = self.t.shape_of(names[0])[1]
        to_q4_0 = self.to_q4_0 and in_features % 32 == 0  # (Q4_0 blocks are 32 inputs wide)
        parts = [self._part(n, to_q4_0) for n in names]
        if all(isinstance(p, Segment) for p in parts):
            return GGUFLinear(parts, in_features, bias)
        # A fused layer with a float part: the whole layer in fp32 (exactly the file's values).
        kernels = native_kernels()
        weight = torch.cat(
            [
                p
                if isinstance(p, torch.Tensor)
                else kernels.gguf_unpack_rows(p.packed, p.type_id, in_features, torch.arange(p.out_features))
                for p in parts
            ]
        )
        return make_linear(weight, bias, WeightFormat("fp32"))

    def embedding(self, name: str) -> nn.Module:
        part = self._part(name)
        if isinstance(part, Segment):
            return GGUFEmbedding(part, self.t.shape_of(name)[1])
        return self.floats.embedding(name)

    def tied_head(self, embedding: nn.Module) -> nn.Module:
        if isinstance(embedding, GGUFEmbedding):
            return embedding.as_linear()
        return self.floats.tied_head(embedding)
