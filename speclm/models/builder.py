"""Building the decoder from a Checkpoint: one procedure (names, shapes, fusion of QKV and gate/up), two
sources of layers: float weights converted to an explicit runtime format, or a GGUF file's tensors
kept on their own grids (the `auto` format)."""

from __future__ import annotations

import itertools
import warnings

import torch
from torch import nn
from tqdm import tqdm

from speclm.models.checkpoint import (
    Checkpoint,
    ModelLoadError,
    format_advice,
    return_big_frees_to_os,
    single_threaded,
    trim_freed_memory,
)
from speclm.models.device import gpu_dtype
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
from speclm.models.layers import RMSNorm
from speclm.models.llama import LlamaModel
from speclm.models.pack_cache import MappedArena, PackCache, StaleEntry
from speclm.models.quant_linear import COMPUTE_DTYPE, WeightFormat, head_format, make_linear


def build_model(
    checkpoint: Checkpoint,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    weights: str | WeightFormat | None = None,
    head_rows: torch.Tensor | None = None,
) -> LlamaModel:
    """Instantiate the decoder from the checkpoint, fusing QKV and gate/up, with its linear layers in
    the runtime format `weights`: fp32 (the default here) | bf16 | int8 | int4[:GROUP] | auto (a GGUF
    file's own types where speclm's kernels run them; fp32 for anything else).

    `head_rows` (token ids; a draft's token map): where the head is a GGUF tensor of its own, only those
    rows are loaded, and `model.head_rows` says so (its logits' column j is token head_rows[j]); else
    the head is whole and `model.head_rows` is None.

    Layers are built one at a time, so at most one layer's float weights exist beside the model.
    """
    fmt = WeightFormat.parse(weights)
    if torch.device(device).type == "cuda":
        return _build_on_gpu(checkpoint, fmt, torch.device(device))
    native = native_source_applies(checkpoint)
    if fmt.name == "auto" and not native:
        fmt = WeightFormat("fp32")
    advice = format_advice(checkpoint, fmt)
    if advice:
        warnings.warn(advice, stacklevel=2)
    if fmt.name != "fp32" and (dtype != torch.float32 or device != "cpu"):
        raise ValueError(f"--weights {fmt.label} runs on the CPU with fp32 activations; got {dtype} on {device}")
    return_big_frees_to_os()
    if native and fmt.name in ("auto", "q4_0"):
        model, source = _build_native(checkpoint, fmt.name == "q4_0", head_rows)
    else:
        # The float path is many small torch ops, which one thread runs best on a busy machine.
        source = FloatSource(checkpoint, fmt, dtype, device)
        with single_threaded():
            model = _build(checkpoint, source, dtype, device)
    trim_freed_memory()
    model.weight_format = fmt
    model.head_rows = source.head_rows if isinstance(source, NativeSource) else None
    return model.eval()


GPU_FORMATS = ("auto", "bf16", "fp32")  # a GPU runs dense layers only (speclm's quantized kernels are CPU code)


def _build_on_gpu(checkpoint: Checkpoint, fmt: WeightFormat, device: torch.device) -> LlamaModel:
    """The decoder with dense weights on a GPU: a GGUF file's tensors dequantized, safetensors and llama2.c
    as stored, all cast to bf16 (`auto`: fp16 on a GPU without bf16) or kept fp32 (`fp32`, the exact
    reference). Norms, embedding and the residual stream take the same dtype, so no CPU kernel applies
    (speclm.models.gpu_attention holds the GPU attention)."""
    if fmt.name not in GPU_FORMATS:
        raise ValueError(f"--weights {fmt.label} runs on the CPU only; on {device} use one of {', '.join(GPU_FORMATS)}")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}.get(fmt.name) or gpu_dtype(device)
    model = _build(checkpoint, FloatSource(checkpoint, WeightFormat("fp32"), dtype, device), dtype, device)
    model.weight_format, model.head_rows = fmt, None
    return model.eval()


def _build_native(
    checkpoint: Checkpoint, to_q4_0: bool, head_rows: torch.Tensor | None
) -> tuple[LlamaModel, NativeSource]:
    """A GGUF file on its own grids: mapped from its pack cache entry when there is one, else repacked
    (its time is a few large calls, split over the threads) and the entry written for the next load."""
    subset = head_rows if not checkpoint.config.tie_word_embeddings else None
    cache = PackCache.for_file(checkpoint.tensors.path, to_q4_0, subset)
    mapped = cache.open() if cache is not None else None
    if mapped is not None:
        try:
            source = NativeSource(checkpoint, to_q4_0, subset, arena=mapped)
            model = _build(checkpoint, source, torch.float32, "cpu")
            mapped.check_complete()
            return model, source
        except StaleEntry as e:
            warnings.warn(f"speclm: the pack cache entry {cache.pack} is stale ({e}); rebuilding it", stacklevel=3)
            cache.discard()
    writer = cache.writer() if cache is not None else None
    source = NativeSource(checkpoint, to_q4_0, subset, arena=PackArena(writer))
    try:
        model = _build(checkpoint, source, torch.float32, "cpu")
    except BaseException:
        if writer is not None:
            cache.abandon(writer)
        raise
    if writer is not None:
        cache.finish(source.arena)
    return model, source


def native_source_applies(checkpoint: Checkpoint) -> bool:
    """GGUF files run on their own grids where the kernels exist (CPU with AVX-512 VNNI)."""
    return checkpoint.metadata.get("format") == "gguf" and native_kernels() is not None


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
        head_rows: torch.Tensor | None = None,
        arena: PackArena | MappedArena | None = None,
    ) -> None:
        self.t = checkpoint.tensors  # speclm.models.gguf_loader.LazyTensors
        self.to_q4_0 = to_q4_0
        self.head_rows = head_rows  # the head's rows to load (None: all)
        self.floats = FloatSource(checkpoint, WeightFormat("fp32"), torch.float32, "cpu")
        self._scratch = torch.empty(0, dtype=torch.uint8)  # file bytes of the tensor being repacked
        self._converted = torch.empty(0, dtype=torch.uint8)  # its bytes as Q4_0 (to_q4_0)
        # Where packed tensors go; a mapped cache entry's arena hands them out already packed.
        self.arena = arena if arena is not None else PackArena()

    def tensor(self, name: str) -> torch.Tensor:
        return self.t[name]

    def _part(self, name: str, to_q4_0: bool = False, order: torch.Tensor | None = None) -> Segment | torch.Tensor:
        """One tensor repacked; with `order`, output i is the file's row order[i] (else its rotary order)."""
        type_name = self.t.type_name(name)
        if type_name not in NATIVE_TYPES:
            if order is not None:  # (a float head: whole; the proposer selects its rows)
                self.head_rows = None
            return quantized_segment(self.t[name], "Q4_0") if to_q4_0 else self.t[name]
        kernels, rows = native_kernels(), self.t.rows_of(name)
        row_bytes = self.t.byte_size(name) // rows
        subset = order is not None and len(order) < rows
        out_type = "Q4_0" if to_q4_0 else type_name
        out_rows = len(order) if subset else rows
        out_row_bytes = self.t.shape_of(name)[1] // 32 * 18 if out_type != type_name else row_bytes
        out = self.arena.take(kernels.gguf_packed_bytes(NATIVE_TYPES[out_type], out_rows, out_row_bytes))
        if self.arena.filled:
            return Segment(out_type, out, out_rows)
        # Rows are read a slice at a time, so the scratch stays small: fresh memory is costly to touch
        # (a page fault per page), and a large tensor (an embedding, a head) would need that much more.
        step = max(16, SLICE_BYTES // row_bytes // 16 * 16)
        if subset:  # some rows (a draft's head): gathered slice by slice
            selected = torch.empty(len(order), row_bytes, dtype=torch.uint8)
            for first in range(0, rows, step):
                raw = self._read(name, first, min(rows, first + step), row_bytes)
                hit = ((order >= first) & (order < first + len(raw))).nonzero().flatten()
                selected[hit] = raw[order[hit] - first]
            if out_type != type_name:
                selected = self._to_q4_0(selected, type_name)
            return Segment(out_type, kernels.gguf_pack(selected, NATIVE_TYPES[out_type], NO_ORDER, out, 0), out_rows)
        order = order if order is not None else self.t.rotary_row_order(name)
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
        order = self.head_rows if head else None
        parts = [self._part(n, to_q4_0, order) for n in names]
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


def _build(checkpoint: Checkpoint, source: FloatSource | NativeSource, dtype: torch.dtype, device: str) -> LlamaModel:
    config, names = checkpoint.config, checkpoint.tensors
    with torch.device("meta"):
        model = LlamaModel(config)
    used: set[str] = set()

    def take(name: str, shape: tuple[int, ...]) -> str:
        used.add(name)
        if name not in names:
            raise ModelLoadError(f"{checkpoint.source}: missing tensor {name!r}")
        found = tuple(names.shape_of(name))
        if found != tuple(shape):
            raise ModelLoadError(f"{checkpoint.source}: tensor {name} has shape {found}, config implies {tuple(shape)}")
        return name

    def param(module: nn.Module, attr: str, name: str) -> None:
        value = source.tensor(take(name, getattr(module, attr).shape)).to(device=device, dtype=dtype)
        setattr(module, attr, nn.Parameter(value, requires_grad=False))

    def linear(
        parent: nn.Module, attr: str, parts: list[str], bias_parts: list[str] | None = None, head: bool = False
    ) -> None:
        meta = getattr(parent, attr)
        rows = [names.shape_of(p)[0] for p in parts]
        for p, n in zip(parts, rows):
            take(p, (n, meta.weight.shape[1]))
        if sum(rows) != meta.weight.shape[0]:
            raise ModelLoadError(
                f"{checkpoint.source}: {', '.join(parts)} give {sum(rows)} outputs, config implies "
                f"{meta.weight.shape[0]}"
            )
        bias = None
        if bias_parts:
            bias = torch.cat([source.tensor(take(b, (n,))) for b, n in zip(bias_parts, rows)]).float()
        setattr(parent, attr, source.linear(parts, bias, head))

    e = "model.embed_tokens.weight"
    model.embed_tokens = source.embedding(take(e, (config.vocab_size, config.hidden_size)))
    param(model.norm, "weight", "model.norm.weight")
    layers = tqdm(model.layers, desc="loading layers", unit="layer", leave=False, disable=None)  # on a TTY only
    for i, layer in enumerate(layers):
        p = f"model.layers.{i}."
        param(layer.input_layernorm, "weight", p + "input_layernorm.weight")
        param(layer.post_attention_layernorm, "weight", p + "post_attention_layernorm.weight")
        qkv = [p + f"self_attn.{x}_proj.weight" for x in "qkv"]
        qkv_bias = [p + f"self_attn.{x}_proj.bias" for x in "qkv"] if config.attention_bias else None
        linear(layer.self_attn, "qkv_proj", qkv, qkv_bias)
        o_bias = [p + "self_attn.o_proj.bias"] if config.attention_output_bias else None
        linear(layer.self_attn, "o_proj", [p + "self_attn.o_proj.weight"], o_bias)
        linear(layer.mlp, "gate_up_proj", [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
        linear(layer.mlp, "down_proj", [p + "mlp.down_proj.weight"])
    if config.tie_word_embeddings:
        model.lm_head = source.tied_head(model.embed_tokens)
    else:
        linear(model, "lm_head", ["lm_head.weight"], head=True)
    ignorable = ("lm_head.weight",) if config.tie_word_embeddings else ()
    unused = sorted(k for k in names if k not in used and k not in ignorable and not k.endswith("rotary_emb.inv_freq"))
    if unused:
        # A dropped tensor (an unsupported bias, say) would silently change the model's output.
        raise ModelLoadError(
            f"{checkpoint.source}: tensors speclm's {config.architecture} model does not use: "
            f"{', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''} (unsupported model feature)"
        )
    model.rotary = type(model.rotary)(config).to(device)  # buffers were on meta
    if isinstance(source, FloatSource) and source.fmt.name in ("bf16", "int8", "int4"):
        # The quantized kernels take bf16 inputs: bf16 norm weights make every norm emit bf16, so the
        # linear layers run in bf16 without per-linear casts; the residual stream, the embedding
        # lookup, and on the CPU attention with its KV cache (LlamaModel.attn_dtype) stay fp32.
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight = nn.Parameter(module.weight.detach().to(COMPUTE_DTYPE), requires_grad=False)
    left = [n for n, x in itertools.chain(model.named_parameters(), model.named_buffers()) if x.is_meta]
    assert not left, f"build_model left tensors unset: {left}"
    return model
