"""GGUF-native weights: linear layers and embeddings that keep each tensor's own quantization grid
(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K), repacked by speclm's kernels (speclm/kernels/gguf_pack.cpp;
the layout: gguf_format.h).

A layer's memory is about its tensor's size in the file, the matmul quantizes each activation row to
int8 as llama.cpp does, and every row's result depends on that row only (exact speculation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from speclm.kernels import cpu_kernels
from speclm.models.op_module import OpModule

# GGML type ids (gguf.GGMLQuantizationType) the kernels run on their own grid.
NATIVE_TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
NO_ORDER = torch.empty(0, dtype=torch.long)
NO_BYTES = torch.empty(0, dtype=torch.uint8)


def native_kernels():
    """speclm's compiled kernels when they run GGUF-native weights here (CPU with AVX-512 VNNI, or AVX2 with
    FMA and F16C), else None."""
    kernels = cpu_kernels()
    return kernels if kernels is not None and kernels.gguf_available() else None


@dataclass
class Segment:
    """One tensor's rows of a GGUF-native layer: `packed` holds `out_features` outputs of type `type_name`."""

    type_name: str
    packed: torch.Tensor  # uint8, the kernels' layout
    out_features: int

    @property
    def type_id(self) -> int:
        return NATIVE_TYPES[self.type_name]

    @classmethod
    def from_raw(
        cls, type_name: str, raw: torch.Tensor, order: torch.Tensor | None = None, arena: PackArena | None = None
    ) -> Segment:
        """Repack a tensor's bytes (raw [rows, row_bytes] uint8, as stored in the file); output i is raw
        row order[i] when an order is given (some or all rows). With an arena the packed bytes are a view
        of its memory."""
        kernels, type_id = native_kernels(), NATIVE_TYPES[type_name]
        rows = raw.shape[0] if order is None else len(order)
        out = NO_BYTES if arena is None else arena.take(kernels.gguf_packed_bytes(type_id, rows, raw.shape[1]))
        packed = kernels.gguf_pack(raw, type_id, NO_ORDER if order is None else order, out, 0)
        return cls(type_name, packed, rows)


class BufferFile(Protocol):
    """Where a PackArena's buffers can live instead of anonymous memory: a file being written
    (speclm/models/pack_cache.py: PackWriter)."""

    failed: Exception | None

    def buffer(self, nbytes: int) -> torch.Tensor | None:
        """A new writable buffer of `nbytes` in the file, or None once the file has failed."""

    def reserve(self, buffer: int, offset: int, nbytes: int) -> bool:
        """Reserve the file's blocks for a take of buffer `buffer`; False (and failed) when it cannot."""


class PackArena:
    """Memory for a model's packed tensors, handed out from a few large buffers on 2 MB pages.

    A buffer of its own per tensor leaves the tensor's ends, up to 2 MB each, on 4 kB pages: for a
    1.5B model that was a fifth of its weights, each 4 kB a page fault at load and a TLB miss in every
    pass. Views of one buffer keep all of it alive, which is what a model's weights need; the unused end
    of a buffer is never touched and so never resident. The takes are recorded, so that the arena can
    be written as a cache entry (speclm/models/pack_cache.py) and replayed from it.
    """

    BUFFER_BYTES = 256 << 20
    ALIGN = 64  # the kernels' records start on cache lines
    filled = False  # its views are fresh memory for the loader to pack into (a mapped entry's are packed)

    def __init__(self, writer: BufferFile | None = None) -> None:
        self.writer = writer  # buffers in a cache entry's file while it works (speclm/models/pack_cache.py)
        self.buffers: list[torch.Tensor] = []
        self.in_file: list[bool] = []  # per buffer: a region of the writer's file
        self.used = 0  # in the last buffer
        self.takes: list[tuple[int, int, int]] = []  # (buffer, offset, bytes) per take

    def take(self, nbytes: int) -> torch.Tensor:
        """A fresh uint8 view of `nbytes` bytes."""
        if not self.buffers or self.used + nbytes > self.buffers[-1].numel():
            self._add_buffer(nbytes)
        if self.in_file[-1] and not self.writer.reserve(len(self.buffers) - 1, self.used, nbytes):
            self._add_buffer(nbytes)  # (no room on the disk: anonymous memory from here on)
        view = self.buffers[-1][self.used : self.used + nbytes]
        self.takes.append((len(self.buffers) - 1, self.used, nbytes))
        self.used += -(-nbytes // self.ALIGN) * self.ALIGN
        return view

    def _add_buffer(self, nbytes: int) -> None:
        size = max(self.BUFFER_BYTES, nbytes)
        mapped = self.writer.buffer(size) if self.writer is not None else None  # (None once the writer failed)
        self.in_file.append(mapped is not None)
        self.buffers.append(mapped if mapped is not None else native_kernels().huge_page_buffer(size))
        self.used = 0

    def buffer_used(self) -> list[int]:
        """The bytes each buffer's takes reach to."""
        ends = [0] * len(self.buffers)
        for buffer, offset, nbytes in self.takes:
            ends[buffer] = max(ends[buffer], offset + nbytes)
        return ends


QUANTIZE_ROWS = 4096  # rows converted at a time: bounds the float temporaries


def quantized_segment(weight: torch.Tensor, type_name: str) -> Segment:
    """fp32 weight [out, in] quantized to a GGUF type the gguf package can write (Q4_0, Q8_0, ...), repacked."""
    import gguf

    kind = gguf.GGMLQuantizationType[type_name]
    raw = [torch.from_numpy(gguf.quants.quantize(chunk.float().numpy(), kind)) for chunk in weight.split(QUANTIZE_ROWS)]
    return Segment.from_raw(type_name, torch.cat(raw))


class GGUFLinear(OpModule):
    """y = x @ W.T + b where W's rows are one or more GGUF tensors on their own grids (a fused QKV
    projection may mix types); fp32 in and out."""

    def __init__(self, segments: list[Segment], in_features: int, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.segments, self.in_features = segments, in_features
        self.out_features = sum(s.out_features for s in segments)
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous())
        for i, s in enumerate(segments):  # buffers, so .to()/state_dict see them
            self.register_buffer(f"packed_{i}", s.packed, persistent=False)

    def op(self) -> Callable[[torch.Tensor], torch.Tensor]:
        """forward as a closure over this layer's tensors (LayerOps)."""
        op = native_kernels().gguf_matmul
        packed = [s.packed for s in self.segments]
        types = [s.type_id for s in self.segments]
        sizes = [s.out_features for s in self.segments]
        bias = self.bias if self.bias is not None else NO_ORDER.float()
        return lambda x: op(x if x.dtype == torch.float32 else x.float(), packed, types, sizes, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op()(x)

    def dequantized_weight(self) -> torch.Tensor:
        """The fp32 [out, in] weight this layer computes with (activation rounding aside)."""
        kernels = native_kernels()
        return torch.cat(
            [
                kernels.gguf_unpack_rows(s.packed, s.type_id, self.in_features, torch.arange(s.out_features))
                for s in self.segments
            ]
        )

    def rows(self, index: torch.Tensor) -> GGUFLinear:
        """A layer computing only output rows `index` of this one, on the same grid (a draft head over a
        token subset). Only single-segment layers (heads) are cut."""
        assert len(self.segments) == 1, "rows() cuts a single-tensor layer"
        s, kernels = self.segments[0], native_kernels()
        packed = kernels.gguf_select_rows(s.packed, s.type_id, self.in_features, index)
        bias = None if self.bias is None else self.bias[index]
        return GGUFLinear([Segment(s.type_name, packed, len(index))], self.in_features, bias)

    def extra_repr(self) -> str:
        types = "+".join(f"{s.type_name}x{s.out_features}" for s in self.segments)
        return (
            f"in_features={self.in_features}, out_features={self.out_features} ({types}), bias={self.bias is not None}"
        )


class GGUFEmbedding(nn.Module):
    """A token-embedding table kept on its GGUF grid; a lookup dequantizes the rows it needs (fp32)."""

    def __init__(self, segment: Segment, embedding_dim: int) -> None:
        super().__init__()
        self.segment, self.embedding_dim = segment, embedding_dim
        self.num_embeddings = segment.out_features
        self.register_buffer("packed", segment.packed, persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # [n] -> [n, dim]
        kernels = native_kernels()
        rows = kernels.gguf_unpack_rows(self.segment.packed, self.segment.type_id, self.embedding_dim, tokens.flatten())
        return rows.view(*tokens.shape, self.embedding_dim)

    def dequantized_weight(self) -> torch.Tensor:
        return self(torch.arange(self.num_embeddings))

    def as_linear(self) -> GGUFLinear:
        """The same table as an output head (tied embeddings): no second copy."""
        return GGUFLinear([self.segment], self.embedding_dim)
