"""The decoder layers of a model whose projections are all GGUF-native, run by one C++ call per pass
(speclm/kernels/gguf_decoder.cpp) wherever the rows attend like decoding: the engine's passes over its
paged pool, a draft model's over its contiguous cache. Same kernels, same order, same bits as the
Python layers."""

from __future__ import annotations

import torch

from speclm.kernels import cpu_kernels
from speclm.kv.cache import KVCache
from speclm.kv.paged_cache import PagedKVCache
from speclm.models.attention import AttentionMetadata, DecodeRows, PagedAttentionMetadata
from speclm.models.gguf_weights import GGUFLinear


def native_decoder(layers) -> object | None:
    """A GGUFDecoder over `layers` (DecoderLayer modules), or None when one of them does not fit: a
    projection that is not GGUF-native or a norm that is not fp32, or no kernels here."""
    kernels = cpu_kernels()
    if kernels is None or not kernels.gguf_available() or len(layers) == 0:
        return None
    if not all(getattr(layer, "native", True) for layer in layers):
        return None  # a layer that declares the llama block's C++ decoder does not run it (variants.py)
    first = layers[0]
    a = first.self_attn
    eps = first.input_layernorm.eps
    decoder = kernels.GGUFDecoder(a.num_heads, a.num_kv_heads, a.head_dim, eps)
    for layer in layers:
        projections = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not all(type(p) is GGUFLinear for p in projections):
            return None
        if any(n.weight.dtype != torch.float32 or n.eps != eps for n in norms):
            return None
        decoder.add_layer(
            norms[0].weight.detach(),
            norms[1].weight.detach(),
            [[s.packed for s in p.segments] for p in projections],
            [[s.type_id for s in p.segments] for p in projections],
            [[s.out_features for s in p.segments] for p in projections],
            [p.bias if p.bias is not None else torch.empty(0) for p in projections],
        )
    return decoder


def native_rows(cache, meta, x: torch.Tensor) -> tuple[torch.Tensor, DecodeRows] | None:
    """(the new rows' cache slots, their DecodeRows) when the native decoder can run this pass, else None:
    fp32 rows that attend like decoding over an fp32 cache (not the int8 pool), with no queries wanted
    by a KV eviction policy; the Python layers run the rest. A prompt from slot 0 on a contiguous cache
    (a draft model's prefill) attends like decoding here, one SDPA call in the Python layers."""
    if not isinstance(cache, (KVCache, PagedKVCache)) or x.dtype != torch.float32 or x.device.type != "cpu":
        return None
    if cache.keys.dtype != torch.float32:
        return None
    if isinstance(cache, PagedKVCache) and isinstance(meta, PagedAttentionMetadata):
        if cache.quantize or meta.queries is not None:
            return None
        return meta.write_slots(x.device), meta.pooled()
    if isinstance(cache, KVCache) and isinstance(meta, AttentionMetadata):
        rows = meta.decode_rows(x.device, prompt_too=True)
        return None if rows is None else (meta.write_slots(x.device), rows)
    return None
