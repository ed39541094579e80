"""The in-memory checkpoint form every loader produces, and building a model from it."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import itertools
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from speclm.models.config import ModelConfig
from speclm.models.layers import RMSNorm
from speclm.models.llama import LlamaModel
from speclm.models.quant_linear import COMPUTE_DTYPE, WeightFormat, head_format, make_linear


class ModelLoadError(ValueError):
    """A model file is missing, corrupt, or describes something speclm cannot run."""


@dataclass
class Checkpoint:
    """Weights under Hugging Face tensor names (model.layers.N.self_attn.q_proj.weight, ...), fp32."""

    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    source: str
    metadata: dict = field(default_factory=dict)


def layer_tensor(tensors: dict[str, torch.Tensor], layer: int, name: str) -> torch.Tensor | None:
    return tensors.get(f"model.layers.{layer}.{name}")


def build_model(
    checkpoint: Checkpoint,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    weights: str | WeightFormat | None = None,
) -> LlamaModel:
    """Instantiate the decoder from the checkpoint, fusing QKV and gate/up, with its linear layers in
    the runtime format `weights` (fp32 | bf16 | int8 | int4[:GROUP]).

    Layers are built one at a time from the checkpoint's tensors, so with a lazily dequantizing
    checkpoint (GGUF) at most one layer's fp32 weights exist beside the quantized model.
    """
    fmt = WeightFormat.parse(weights)
    advice = format_advice(checkpoint, fmt)
    if advice:
        warnings.warn(advice, stacklevel=2)
    return_big_frees_to_os()
    with single_threaded():
        model = _build(checkpoint, dtype, device, fmt)
    trim_freed_memory()
    return model


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


def _build(checkpoint: Checkpoint, dtype: torch.dtype, device: str, fmt: WeightFormat) -> LlamaModel:
    if fmt.name != "fp32" and (dtype != torch.float32 or device != "cpu"):
        raise ValueError(f"--weights {fmt.label} runs on the CPU with fp32 activations; got {dtype} on {device}")
    config, t = checkpoint.config, checkpoint.tensors
    with torch.device("meta"):
        model = LlamaModel(config)

    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        used.add(name)
        if name not in t:
            raise ModelLoadError(f"{checkpoint.source}: missing tensor {name!r}")
        return t[name]

    def check(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        if tuple(tensor.shape) != tuple(shape):
            raise ModelLoadError(
                f"{checkpoint.source}: tensor {name} has shape {tuple(tensor.shape)}, config implies {tuple(shape)}"
            )
        return tensor.to(device=device, dtype=dtype)

    def set_param(module: nn.Module, attr: str, name: str, tensor: torch.Tensor) -> None:
        value = check(name, tensor, getattr(module, attr).shape)
        setattr(module, attr, nn.Parameter(value, requires_grad=False))

    def set_linear(
        parent: nn.Module,
        attr: str,
        name: str,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        head_format: WeightFormat | None = None,
    ) -> None:
        meta = getattr(parent, attr)
        weight = check(name, weight, meta.weight.shape)
        if bias is not None:
            bias = check(name.replace("weight", "bias"), bias, meta.bias.shape)
        setattr(parent, attr, make_linear(weight, bias, head_format or fmt))

    set_param(model.embed_tokens, "weight", "model.embed_tokens.weight", take("model.embed_tokens.weight"))
    set_param(model.norm, "weight", "model.norm.weight", take("model.norm.weight"))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        set_param(layer.input_layernorm, "weight", p + "input_layernorm.weight", take(p + "input_layernorm.weight"))
        set_param(
            layer.post_attention_layernorm,
            "weight",
            p + "post_attention_layernorm.weight",
            take(p + "post_attention_layernorm.weight"),
        )
        qkv = torch.cat([take(p + f"self_attn.{x}_proj.weight") for x in "qkv"], dim=0)
        qkv_bias = (
            torch.cat([take(p + f"self_attn.{x}_proj.bias") for x in "qkv"], dim=0) if config.attention_bias else None
        )
        set_linear(layer.self_attn, "qkv_proj", p + "self_attn.qkv_proj.weight", qkv, qkv_bias)
        o_bias = take(p + "self_attn.o_proj.bias") if config.attention_output_bias else None
        set_linear(
            layer.self_attn, "o_proj", p + "self_attn.o_proj.weight", take(p + "self_attn.o_proj.weight"), o_bias
        )
        gate_up = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")], dim=0)
        set_linear(layer.mlp, "gate_up_proj", p + "mlp.gate_up_proj.weight", gate_up)
        set_linear(layer.mlp, "down_proj", p + "mlp.down_proj.weight", take(p + "mlp.down_proj.weight"))
        del qkv, qkv_bias, gate_up
    if config.tie_word_embeddings and fmt.name == "fp32":
        model.lm_head.weight = model.embed_tokens.weight
    else:  # a quantized head keeps its own copy; the embedding lookup stays exact fp32
        head = "model.embed_tokens.weight" if config.tie_word_embeddings else "lm_head.weight"
        weight = model.embed_tokens.weight if config.tie_word_embeddings else take(head)
        set_linear(model, "lm_head", head, weight, head_format=head_format(fmt))
    ignorable = ("lm_head.weight",) if config.tie_word_embeddings else ()
    unused = sorted(k for k in t if k not in used and k not in ignorable and not k.endswith("rotary_emb.inv_freq"))
    if unused:
        # A dropped tensor (an unsupported bias, say) would silently change the model's output.
        raise ModelLoadError(
            f"{checkpoint.source}: tensors speclm's {config.architecture} model does not use: "
            f"{', '.join(unused[:5])}{' ...' if len(unused) > 5 else ''} (unsupported model feature)"
        )
    model.rotary = type(model.rotary)(config).to(device)  # buffers were on meta
    if fmt.name != "fp32":
        # The quantized kernels take bf16 inputs: bf16 norm weights make every norm emit bf16, so the
        # linear layers run in bf16 without per-linear casts; the residual stream, the embedding
        # lookup, and on the CPU attention with its KV cache (LlamaModel.attn_dtype) stay fp32.
        for module in model.modules():
            if isinstance(module, RMSNorm):
                module.weight = nn.Parameter(module.weight.detach().to(COMPUTE_DTYPE), requires_grad=False)
    left = [n for n, x in itertools.chain(model.named_parameters(), model.named_buffers()) if x.is_meta]
    assert not left, f"build_model left tensors unset: {left}"
    model.weight_format = fmt
    return model.eval()
