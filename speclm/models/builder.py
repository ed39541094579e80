"""Building the decoder from a Checkpoint: one procedure (names, shapes, fusion of QKV and gate/up), two
sources of layers: float weights converted to an explicit runtime format, or a GGUF file's tensors
kept on their own grids (the `auto` format)."""

from __future__ import annotations

import itertools
import warnings

import torch
from torch import nn
from tqdm import tqdm

from speclm.config import WeightFormat
from speclm.models.checkpoint import Checkpoint, ModelLoadError, format_advice
from speclm.models.device import column_major_weights, gpu_dtype
from speclm.models.gguf_weights import PackArena, native_kernels
from speclm.models.layer_sources import FloatSource, NativeSource
from speclm.models.layers import RMSNorm
from speclm.models.llama import LlamaModel
from speclm.models.load_tuning import loading_memory, single_threaded
from speclm.models.pack_cache import PackCache, StaleEntry
from speclm.models.quantizers import COMPUTE_DTYPE


def build_model(
    checkpoint: Checkpoint,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    weights: str | WeightFormat | None = None,
) -> LlamaModel:
    """Instantiate the decoder from the checkpoint, fusing QKV and gate/up, with its linear layers in
    the runtime format `weights`: fp32 (the default here) | bf16 | int8 | int4[:GROUP] | auto (a GGUF
    file's own types where speclm's kernels run them; fp32 for anything else).

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
    with loading_memory():
        if native and fmt.name in ("auto", "q4_0"):
            model = _build_native(checkpoint, fmt.name == "q4_0")
        else:
            # The float path is many small torch ops, which one thread runs best on a busy machine.
            source = FloatSource(checkpoint, fmt, dtype, device)
            with single_threaded():
                model = _build(checkpoint, source, dtype, device)
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
    column_major_weights(model)
    return model.eval()


def _build_native(checkpoint: Checkpoint, to_q4_0: bool) -> LlamaModel:
    """A GGUF file on its own grids: mapped from its pack cache entry when there is one, else repacked
    (its time is a few large calls, split over the threads) and the entry written for the next load."""
    cache = PackCache.for_file(checkpoint.tensors.path, to_q4_0)
    mapped = cache.open() if cache is not None else None
    if mapped is not None:
        try:
            model = _build(checkpoint, NativeSource(checkpoint, to_q4_0, arena=mapped), torch.float32, "cpu")
            mapped.check_complete()
            return model
        except StaleEntry as e:
            warnings.warn(f"speclm: the pack cache entry {cache.pack} is stale ({e}); rebuilding it", stacklevel=3)
            cache.discard()
    writer = cache.writer() if cache is not None else None
    source = NativeSource(checkpoint, to_q4_0, arena=PackArena(writer))
    try:
        model = _build(checkpoint, source, torch.float32, "cpu")
    except BaseException:
        if writer is not None:
            cache.abandon(writer)
        raise
    if writer is not None:
        cache.finish(source.arena)
    return model


def native_source_applies(checkpoint: Checkpoint) -> bool:
    """GGUF files run on their own grids where the kernels exist (CPU with AVX-512 VNNI or AVX2)."""
    return checkpoint.metadata.get("format") == "gguf" and native_kernels() is not None


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
        for norm, name in layer.extra_norms() if hasattr(layer, "extra_norms") else ():  # (variants.py)
            param(norm, "weight", p + name + ".weight")
        if config.attention_scale is not None:  # folded into the q norm (variants.py)
            q_norm = layer.self_attn.q_norm  # (a new tensor: the checkpoint's may be the one loaded)
            q_norm.weight = nn.Parameter(q_norm.weight * (config.attention_scale * config.head_dim**0.5), False)
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
    if model.local_rotary is not None:
        model.local_rotary = type(model.rotary)(config, local=True).to(device)
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
