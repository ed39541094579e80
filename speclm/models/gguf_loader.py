"""Read GGUF files (llama.cpp's format) into a Checkpoint whose tensors load lazily."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

import numpy as np
import torch

import speclm.models.families as families
from speclm.models.checkpoint import Checkpoint, ModelLoadError
from speclm.models.config import ModelConfig
from speclm.models.gguf_file import GGUFFile, GGUFFormatError, TensorInfo
from speclm.models.gguf_names import hf_name

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", *families.FAMILY_ARCHITECTURES)
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "Q8_K")


def open_gguf(path: str) -> GGUFFile:
    """The file's metadata and tensor table, with format errors turned into a ModelLoadError naming the
    file. Parsed once per file version: the model loader and the tokenizer loader both open it."""
    try:
        stat = os.stat(path)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot open GGUF file: {e}") from e
    return _cached_file(os.path.abspath(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=2)
def _cached_file(path: str, mtime_ns: int, size: int) -> GGUFFile:
    try:
        return GGUFFile(path)
    except (GGUFFormatError, OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: not a readable GGUF file (truncated or corrupt?): {e}") from e


def field_value(file: GGUFFile, key: str, default=None):
    """A GGUF metadata field's value, or `default`."""
    return file.fields.get(key, default)


def rope_rows_to_half_split(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder Q/K rows from the interleaved RoPE layout (Meta, llama.cpp, llama2.c) to half-split (HF)."""
    out_features = w.shape[0]
    return w.reshape(num_heads, out_features // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def half_split_to_rope_rows(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of rope_rows_to_half_split: HF's half-split Q/K rows to llama.cpp's interleaved layout."""
    out_features = w.shape[0]
    return w.reshape(num_heads, 2, out_features // num_heads // 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _blocks(raw: torch.Tensor, block_bytes: int) -> torch.Tensor:
    """A quantized tensor's bytes [rows, row_bytes] as [rows, blocks, block_bytes] uint8."""
    return raw.reshape(raw.shape[0], -1, block_bytes)


def _fp16_field(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The fp16 stored at `offset` of every block, as fp32 [rows, blocks, 1]."""
    return blocks[..., offset : offset + 2].contiguous().view(torch.float16).float()


def dequantize_q4_1(t) -> torch.Tensor:
    """Q4_1 blocks of 32 (fp16 d, fp16 m, 16 bytes of nibbles: low halves first) -> fp32 d*q + m."""
    b = _blocks(t, 20)
    qs = b[..., 4:]  # [rows, blocks, 16]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float()  # [rows, blocks, 32]
    return (q * _fp16_field(b, 0) + _fp16_field(b, 2)).reshape(b.shape[0], -1)


def dequantize_q4_0(t) -> torch.Tensor:
    """Q4_0 blocks of 32 (fp16 d, 16 bytes of nibbles) -> fp32 d*(q - 8)."""
    b = _blocks(t, 18)
    qs = b[..., 2:]
    q = torch.cat([qs & 0x0F, qs >> 4], dim=-1).float() - 8
    return (q * _fp16_field(b, 0)).reshape(b.shape[0], -1)


def dequantize_q8_0(t) -> torch.Tensor:
    """Q8_0 blocks of 32 (fp16 d, 32 int8) -> fp32 d*q."""
    b = _blocks(t, 34)
    q = b[..., 2:].contiguous().view(torch.int8).float()
    return (q * _fp16_field(b, 0)).reshape(b.shape[0], -1)


# Vectorized torch versions of the common types: several times faster than gguf's numpy ones.
_TORCH_DEQUANTIZERS = {"Q4_0": dequantize_q4_0, "Q4_1": dequantize_q4_1, "Q8_0": dequantize_q8_0}


def dequantize_tensor(file: GGUFFile, t: TensorInfo, rows: tuple[int, int] | None = None) -> torch.Tensor:
    """A GGUF tensor (or its rows [first, end): a part of a fused 2-d tensor) as fp32 in PyTorch's [out, in]
    orientation."""
    import gguf

    if t.type_name not in SUPPORTED_TENSOR_TYPES:
        raise ModelLoadError(f"tensor {t.name} has unsupported GGUF type {t.type_name}")
    shape = tuple(reversed(t.shape))
    if rows is None:
        raw = torch.frombuffer(file.read(t), dtype=torch.uint8).view(t.rows, -1)
    else:
        (first, end), row_bytes = rows, t.n_bytes // t.rows
        raw = torch.empty((end - first) * row_bytes, dtype=torch.uint8)
        file.read(t, memoryview(raw.numpy()), first * row_bytes, raw.numel())
        raw, shape = raw.view(end - first, row_bytes), (end - first, *shape[1:])
    if t.type_name in _TORCH_DEQUANTIZERS:
        return _TORCH_DEQUANTIZERS[t.type_name](raw).reshape(shape)
    data = gguf.quants.dequantize(raw.numpy(), gguf.GGMLQuantizationType[t.type_name])
    return torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32).reshape(shape))


class LazyTensors(Mapping):
    """HF-named tensors of a GGUF file, dequantized to fp32 on each access and not kept.

    Building a quantized model then holds one layer's fp32 weights at a time instead of the
    whole fp32 model (peak memory), and nothing is dequantized twice in one build.
    """

    def __init__(
        self,
        file: GGUFFile,
        config: ModelConfig,
        tensors: dict[str, TensorInfo],
        parts: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.file, self.path, self.config, self._tensors = file, file.path, config, tensors  # HF name -> info
        self._parts = parts or {}  # HF name -> its rows (first, end) of a fused tensor (phi3's attn_qkv, ffn_up)

    def _rows(self, name: str) -> tuple[int, int]:
        """The rows of its file tensor a name reads (all of them but for a fused tensor's part)."""
        return self._parts.get(name) or (0, self._tensors[name].rows)

    def __contains__(self, name: object) -> bool:  # (Mapping's default would load the tensor)
        return name in self._tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self._tensors[name]
        try:
            w = dequantize_tensor(self.file, t, self._parts.get(name))
        except (ValueError, IndexError, RuntimeError) as e:
            raise ModelLoadError(f"{self.path}: corrupt tensor data in {t.name}: {e}") from e
        if self.config.architecture == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = self.config.num_heads if "q_proj" in name else self.config.num_kv_heads
            w = rope_rows_to_half_split(w, heads)
        return w

    def shape_of(self, name: str) -> tuple[int, ...]:
        """A tensor's shape in PyTorch's [out, in] orientation, without reading it."""
        shape = tuple(reversed(self._tensors[name].shape))
        first, end = self._rows(name)
        return shape if name not in self._parts else (end - first, *shape[1:])

    def byte_size(self, name: str) -> int:
        """A tensor's bytes in the file."""
        t = self._tensors[name]
        first, end = self._rows(name)
        return t.n_bytes // t.rows * (end - first)

    def type_name(self, name: str) -> str:
        """The GGUF type of a tensor (Q4_K, F32, ...)."""
        return self._tensors[name].type_name

    def raw(self, name: str, scratch: torch.Tensor | None = None, rows: tuple[int, int] | None = None) -> torch.Tensor:
        """A 2-d tensor's bytes as stored, [rows (outputs), row_bytes] uint8, read with a plain file read:
        nothing of the file stays mapped in memory once the caller has repacked them. With `scratch` (a
        uint8 tensor of at least that many bytes) they land there: a loader reusing one buffer for every
        tensor touches fresh memory once, not once per tensor. `rows` (first, end): only those rows."""
        t = self._tensors[name]
        base, base_end = self._rows(name)
        first, end = (base + rows[0], base + rows[1]) if rows is not None else (base, base_end)
        row_bytes = t.n_bytes // t.rows
        n_bytes = (end - first) * row_bytes
        buffer = torch.empty(n_bytes, dtype=torch.uint8) if scratch is None else scratch[:n_bytes]
        try:
            self.file.read(t, memoryview(buffer.numpy()), first * row_bytes, n_bytes)
        except GGUFFormatError as e:
            raise ModelLoadError(f"{self.path}: {e}") from e
        return buffer.view(end - first, row_bytes)

    def rows_of(self, name: str) -> int:
        """A 2-d tensor's rows (outputs) in the file."""
        first, end = self._rows(name)
        return end - first

    def rotary_row_order(self, name: str) -> torch.Tensor | None:
        """For llama GGUFs, the order taking q/k rows from llama.cpp's interleaved rotary layout to the
        half-split one (what __getitem__ applies when it dequantizes); None for other tensors."""
        if self.config.architecture != "llama" or not name.endswith(("q_proj.weight", "k_proj.weight")):
            return None
        heads = self.config.num_heads if "q_proj" in name else self.config.num_kv_heads
        rows = self.rows_of(name)
        return rope_rows_to_half_split(torch.arange(rows)[:, None], heads).flatten()

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


def config_from_gguf(reader: GGUFFile, path: str) -> ModelConfig:
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: unsupported GGUF architecture {arch!r} (supported: {', '.join(SUPPORTED_GGUF_ARCHITECTURES)})"
        )

    def get(key, default=None):
        return field_value(reader, f"{arch}.{key}", default)

    num_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    tokens = field_value(reader, "tokenizer.ggml.tokens")
    vocab_size = int(get("vocab_size", len(tokens) if tokens is not None else 0))
    rope_scaling = None
    scaling_type = get("rope.scaling.type")
    if scaling_type and scaling_type != "none":
        rope_scaling = {"rope_type": scaling_type, "factor": float(get("rope.scaling.factor", 1.0))}
        original = get("rope.scaling.original_context_length")
        if original:
            rope_scaling["original_max_position_embeddings"] = int(original)
    names = {t.name for t in reader.tensors}
    eos = field_value(reader, "tokenizer.ggml.eos_token_id")
    eot = field_value(reader, "tokenizer.ggml.eot_token_id")
    eos_ids = [int(x) for x in (eos, eot) if x is not None]
    num_layers = int(get("block_count"))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    rotary_dim = int(get("rope.dimension_count", head_dim))
    if rotary_dim != head_dim and arch == "llama":  # (llama.cpp turns interleaved pairs there; we turn half-split)
        raise ModelLoadError(
            f"{path}: partial rotary ({rotary_dim} of {head_dim} dims) in a llama GGUF is not supported"
        )
    fields = dict(
        architecture=arch,
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")),
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(get("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        max_position_embeddings=int(get("context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        attention_bias=arch == "qwen2",
        bos_token_id=field_value(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=list(dict.fromkeys(eos_ids)),
    )
    return ModelConfig(**(fields | families.gguf_extras(arch, get, num_layers, head_dim)))


LONGROPE_TENSORS = {"rope_factors_short.weight": "short_factor", "rope_factors_long.weight": "long_factor"}


def load_gguf(path: str) -> Checkpoint:
    """A Checkpoint of a llama/qwen2/qwen3/gemma3/phi3 GGUF file whose tensors dequantize to fp32 lazily
    (LazyTensors). Every tensor's name and type is checked here, before any weight is read."""
    reader = open_gguf(path)
    config = config_from_gguf(reader, path)
    fused = families.fused_parts(config)
    tensors, parts, quant_types, rope = {}, {}, {}, {}
    for t in reader.tensors:
        name = hf_name(t.name, config.architecture)
        if name is None and t.name not in ("rope_freqs.weight", *LONGROPE_TENSORS):
            # Dropping a tensor we do not understand (an extra bias, say) would change the output.
            raise ModelLoadError(f"{path}: tensor {t.name!r} is not part of a model speclm can run")
        if t.type_name not in SUPPORTED_TENSOR_TYPES:
            raise ModelLoadError(
                f"{path}: tensor {t.name} has GGUF type {t.type_name} (supported: {', '.join(SUPPORTED_TENSOR_TYPES)})"
            )
        if t.name == "rope_freqs.weight" or t.name in LONGROPE_TENSORS:  # (read once every name is checked)
            rope[t.name] = t
            continue
        layer, _, suffix = name.rpartition("layers.")
        index, _, suffix = suffix.partition(".")
        if layer and suffix in fused:  # (phi3's fused q/k/v and gate/up: one file tensor, several parts)
            first = 0
            for part, rows in fused[suffix]:
                part_name = f"{layer}layers.{index}.{part}"
                tensors[part_name], parts[part_name], quant_types[part_name] = t, (first, first + rows), t.type_name
                first += rows
            if first != t.rows:
                raise ModelLoadError(f"{path}: tensor {t.name} has {t.rows} rows, the config implies {first}")
            continue
        tensors[name] = t
        quant_types[name] = t.type_name
    if "rope_freqs.weight" in rope and config.rope_scaling is None:
        # llama.cpp stores llama3-style rope scaling as per-frequency divisors in this tensor.
        factors = dequantize_tensor(reader, rope["rope_freqs.weight"]).flatten().tolist()
        config.rope_scaling = {"rope_type": "freq_factors", "factors": factors}
    longrope = {
        key: dequantize_tensor(reader, rope[name]).flatten().tolist()
        for name, key in LONGROPE_TENSORS.items()
        if name in rope
    }
    if longrope:  # phi3's LongRoPE
        if len(longrope) != 2:
            raise ModelLoadError(f"{path}: LongRoPE needs both rope_factors_short and rope_factors_long")

        def get(key, default):
            return field_value(reader, f"{config.architecture}.{key}", default)

        original = int(get("rope.scaling.original_context_length", config.max_position_embeddings))
        attention = float(get("rope.scaling.attn_factor", 1.0))
        config.rope_scaling = families.longrope(longrope["short_factor"], longrope["long_factor"], original, attention)
    return Checkpoint(
        config,
        LazyTensors(reader, config, tensors, parts),
        source=path,
        metadata={"format": "gguf", "gguf_tensor_types": quant_types},
    )
