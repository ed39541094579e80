"""The metadata and tensor table of a GGUF file (llama.cpp's format), read once into plain Python values.

The header is parsed through a temporary memory map that touches the header's pages only; tensor data
is read later, tensor by tensor, with plain file reads (GGUFFile.read). Large vocabularies (150k tokens
and merges) parse in well under a second, into a few tens of MB.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The bytes are not a GGUF file speclm can read."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry: `shape` in GGUF order (the contiguous dimension first), `offset` from the file's start."""

    name: str
    type_name: str
    shape: tuple[int, ...]
    offset: int
    n_bytes: int

    @property
    def rows(self) -> int:
        return self.shape[-1] if len(self.shape) > 1 else 1


class _Cursor:
    def __init__(self, buffer) -> None:
        self.buffer, self.pos = buffer, 0

    def scalar(self, fmt: str):
        value = struct.unpack_from(fmt, self.buffer, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.scalar("<Q")
        raw = bytes(self.buffer[self.pos : self.pos + n])
        if len(raw) != n:
            raise GGUFFormatError("a string runs past the end of the file")
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def strings(self, count: int) -> list[str]:
        """An array of strings (a vocabulary, its merges: ~10^5 items), in one tight loop."""
        buffer, pos, length = self.buffer, self.pos, struct.Struct("<Q").unpack_from
        end = len(buffer)
        out = []
        for _ in range(count):
            (n,) = length(buffer, pos)
            pos += 8
            if pos + n > end:
                raise GGUFFormatError("a string runs past the end of the file")
            out.append(buffer[pos : pos + n].decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in _SCALARS and count:  # one unpack for the whole array
                fmt = f"<{count}{_SCALARS[item][1]}"
                values = list(struct.unpack_from(fmt, self.buffer, self.pos))
                self.pos += struct.calcsize(fmt)
                return values
            if item == _STRING:
                return self.strings(count)
            return [self.value(item) for _ in range(count)]
        raise GGUFFormatError(f"unknown metadata value type {kind}")


class GGUFFile:
    """A GGUF file's metadata (`fields`: key -> value) and tensor table (`tensors`), by path."""

    def __init__(self, path: str) -> None:
        self.path = path
        size = os.path.getsize(path)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                self._parse(_Cursor(mm), size)
            except (struct.error, IndexError, OverflowError, MemoryError) as e:
                raise GGUFFormatError(f"truncated or corrupt GGUF header ({e})") from e

    def _parse(self, c: _Cursor, size: int) -> None:
        if bytes(c.buffer[:4]) != GGUF_MAGIC:
            raise GGUFFormatError("missing the GGUF magic")
        c.pos = 4
        version = c.scalar("<I")
        if version not in (2, 3):
            raise GGUFFormatError(f"GGUF version {version} (supported: 2, 3)")
        n_tensors, n_fields = c.scalar("<Q"), c.scalar("<Q")
        self.fields: dict[str, object] = {}
        for _ in range(n_fields):
            key = c.string()
            self.fields[key] = c.value(c.scalar("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            dims = tuple(c.scalar("<Q") for _ in range(c.scalar("<I")))
            type_id, offset = c.scalar("<I"), c.scalar("<Q")
            infos.append((name, dims, type_id, offset))
        alignment = int(self.fields.get("general.alignment", 32))
        data_start = -(-c.pos // alignment) * alignment
        self.tensors: list[TensorInfo] = []
        for name, dims, type_id, offset in infos:
            try:
                kind = GGMLQuantizationType(type_id)
            except ValueError as e:
                raise GGUFFormatError(f"tensor {name} has an unknown type id {type_id}") from e
            block_weights, block_bytes = GGML_QUANT_SIZES[kind]
            elements = 1
            for d in dims:
                elements *= d
            n_bytes = elements // block_weights * block_bytes
            if elements % block_weights or data_start + offset + n_bytes > size:
                raise GGUFFormatError(f"tensor {name} does not fit the file (truncated?)")
            self.tensors.append(TensorInfo(name, kind.name, dims, data_start + offset, n_bytes))

    def read(self, tensor: TensorInfo, out=None, start: int = 0, length: int | None = None) -> bytearray | memoryview:
        """The tensor's bytes [start, start + length) (default: all of them), read from the file into `out`
        (a writable buffer of that many bytes) or a new bytearray."""
        length = tensor.n_bytes - start if length is None else length
        if start < 0 or start + length > tensor.n_bytes:
            raise ValueError(f"bytes [{start}, {start + length}) of tensor {tensor.name} ({tensor.n_bytes} bytes)")
        buffer = out if out is not None else bytearray(length)
        with open(self.path, "rb") as f:
            f.seek(tensor.offset + start)
            if f.readinto(buffer) != length:
                raise GGUFFormatError(f"tensor {tensor.name} is truncated")
        return buffer
