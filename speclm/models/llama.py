"""The llama-family decoder (llama, mistral, qwen2): forward -> hidden states, then logits."""

from __future__ import annotations

import functools

import torch
from torch import nn

from speclm.kv.cache import KVCache
from speclm.models.attention import AttentionMetadata, PagedAttentionMetadata, TensorFn
from speclm.models.config import ModelConfig
from speclm.models.layers import DecoderLayer, LayerOps, RMSNorm, residual_layer
from speclm.models.linear import Linear, linear_op, row_chunked
from speclm.models.native_decoder import native_decoder, native_rows
from speclm.models.rope import RotaryEmbedding
from speclm.models.variants import make_layers, variant_layer

PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # the linear fields of LayerOps and VariantOps


class LlamaModel(nn.Module):
    """Decoder-only transformer. `forward` returns hidden states; `compute_logits` applies the head.

    Keeping the two apart lets callers compute logits only where they need them (the last
    prompt token, or the K+1 verification positions) and lets draft heads reuse hidden states.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # (Passing a weight skips nn.Embedding's normal_ init: on a meta tensor that init imports torch's
        # Python decompositions, tens of MB, for a table the loader replaces anyway.)
        table = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=table)
        if table.device.type != "meta":
            nn.init.normal_(self.embed_tokens.weight)
        if config.is_variant:  # qwen3, gemma3 (speclm/models/variants.py)
            self.layers = make_layers(config)
        else:
            self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config)
        self.local_rotary = RotaryEmbedding(config, local=True) if config.rope_local_theta else None
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.lean_ops: list[LayerOps] | None = None  # see use_lean_ops
        self.head_op: TensorFn | None = None
        self.native_decoder = None  # see use_lean_ops

    @property
    def act_dtype(self) -> torch.dtype:
        """The dtype the layers compute in: the norms' weight dtype. fp32 models: fp32. Quantized
        formats: bf16 (their kernels' input), with an fp32 residual stream."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    @property
    def attn_dtype(self) -> torch.dtype:
        """The dtype of attention and the KV cache: fp32 on the CPU whatever the layers compute in (CPUs
        without bf16 arithmetic run bf16 attention many times slower), the layers' dtype elsewhere."""
        return torch.float32 if self.device.type == "cpu" else self.act_dtype

    def new_cache(self, capacity: int, num_layers: int | None = None) -> KVCache:
        """An empty KV cache for one sequence of up to `capacity` tokens."""
        c = self.config
        return KVCache(num_layers or c.num_layers, c.num_kv_heads, c.head_dim, capacity, self.attn_dtype, self.device)

    def use_lean_ops(self, enabled: bool = True, gemm_rows: int | None = None) -> None:
        """Run `forward` (inference) and `compute_logits` through closures over the layers' tensors
        instead of nn.Module calls: the same arithmetic, bit for bit, minus the dispatch. Modules
        replaced or hooked after this call are not seen until it is called again; `hidden_states`
        (training, calibration hooks) always goes through the modules. The engine turns this on. A model
        whose projections are all GGUF-native also gets a native decoder (speclm/models/native_decoder.py),
        which runs a pass's layers in one C++ call where its rows attend like decoding. With `gemm_rows`
        (a GPU's target model), every projection and the head run over fixed chunks of that many rows
        (row_chunked: batch-invariant GEMMs)."""
        self.lean_ops = [layer.ops(lean=True) for layer in self.layers] if enabled else None
        self.head_op = linear_op(self.lm_head) if enabled else None
        if enabled and gemm_rows:
            chunk = functools.partial(row_chunked, rows=gemm_rows)
            self.lean_ops = [ops._replace(**{f: chunk(getattr(ops, f)) for f in PROJECTIONS}) for ops in self.lean_ops]
            self.head_op = chunk(self.head_op)
        # (A model on a GPU has dense layers only: the CPU kernels are not even loaded for it.)
        self.native_decoder = native_decoder(self.layers) if enabled and self.device.type == "cpu" else None

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        cache,  # KVCache or speclm.kv.paged_cache.PagedKVCache
        meta: AttentionMetadata | PagedAttentionMetadata,
        num_layers: int | None = None,
    ) -> torch.Tensor:
        """Hidden states after the final norm, [num_tokens, hidden]. `num_layers` runs a prefix of
        the layers only (self-speculation); the final norm is applied either way."""
        return self.hidden_states(tokens, positions, cache, meta, num_layers, self.lean_ops)

    def hidden_states(
        self,
        tokens: torch.Tensor,  # [num_tokens]
        positions: torch.Tensor,  # [num_tokens]
        cache,
        meta: AttentionMetadata | PagedAttentionMetadata,
        num_layers: int | None = None,
        ops: list[LayerOps] | None = None,
    ) -> torch.Tensor:
        """`forward` without inference mode, so gradients flow (distillation trains through it
        with a fresh cache and AttentionMetadata(0, n), which is plain causal attention). The layers
        run as `ops` (one per layer) when given, else as their modules."""
        x = self.embed_tokens(tokens)
        if self.config.embedding_scale != 1.0:  # gemma: in the embedding's dtype, as transformers
            x = x * torch.tensor(self.config.embedding_scale, dtype=x.dtype)
        cos, sin = (t.to(self.attn_dtype) for t in self.rotary(positions, meta.max_position))
        local = None
        if self.local_rotary is not None:
            local = tuple(t.to(self.attn_dtype) for t in self.local_rotary(positions, meta.max_position))
        native = self.native_decoder if ops is self.lean_ops else None  # (None unless lean ops are on)
        rows = native_rows(cache, meta, x) if native is not None else None
        if rows is not None:
            slots, decode = rows
            empty = decode.lengths[:0]
            table = empty if decode.slots is None else decode.slots
            table_rows = empty if decode.slot_rows is None else decode.slot_rows
            count = num_layers or len(self.layers)
            x = native.run(x, cos, sin, cache.keys, cache.values, slots, decode.lengths, table, table_rows, count)
            return self.norm(x)
        count = num_layers or len(self.layers)
        # Llama-family layers as ops carry their output's norm along: each residual add runs with the norm
        # after it (one GPU launch; add_norm), the last one with the final norm. (A model's layers are all of
        # one kind: LayerOps, or VariantOps for the newer families.)
        carried = ops is not None and type(ops[0]) is LayerOps
        normed = ops[0].input_norm(x) if carried else None
        for i in range(count):
            k_cache, v_cache = cache.layer(i)
            is_local = self.config.is_local(i)
            c, s = local if local is not None and is_local else (cos, sin)
            m = meta.local if is_local and meta.local is not None else meta  # (a pool of their own)
            if carried:
                next_norm = ops[i + 1].input_norm if i + 1 < count else self.norm
                x, normed = residual_layer(x, normed, ops[i], next_norm, c, s, k_cache, v_cache, m)
            elif ops is None:
                x = self.layers[i](x, c, s, k_cache, v_cache, m)
            else:
                x = variant_layer(x, ops[i], c, s, k_cache, v_cache, m)
        return normed if carried else self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor, indices: torch.Tensor | list[int] | None = None) -> torch.Tensor:
        """Logits [len(indices), vocab] for the selected rows of `hidden` (all rows if None), fp32."""
        if indices is not None:
            hidden = hidden[indices]
        logits = self.device_logits(hidden)
        # On a GPU the logits come to the host, where sampling, the rejection sampler and the proposers
        # draw with the requests' CPU generators: one copy per pass, the step's one synchronisation.
        return logits if logits.device.type == "cpu" else logits.cpu()

    def device_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [rows, vocab] fp32 of every row of `hidden`, where hidden lies."""
        return self.finish_logits(self.head_logits(hidden))

    def head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head's output [rows, vocab] in the model's dtype: device_logits before finish_logits."""
        return (self.head_op or self.lm_head)(hidden)

    def finish_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The head's output as the logits: fp32, soft-capped where the model caps them."""
        logits = logits.float()
        cap = self.config.final_logit_softcapping
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def reserve_positions(self, length: int) -> None:
        """Rotary tables for positions below `length` now (a CUDA graph reads them where they lie)."""
        for rotary in (self.rotary, self.local_rotary):
            if rotary is not None:
                rotary.reserve(length)
