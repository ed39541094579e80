"""Read Karpathy's llama2.c checkpoints (.bin, legacy version-0 export) into a Checkpoint."""

from __future__ import annotations

import os
import struct

import numpy as np
import torch

from speclm.models.checkpoint import Checkpoint, ModelLoadError
from speclm.models.config import ModelConfig
from speclm.models.gguf_loader import rope_rows_to_half_split

HEADER = struct.Struct("<7i")


def load_llama2c(path: str) -> Checkpoint:
    """The header is 7 int32 (dim, hidden, layers, heads, kv_heads, vocab, seq_len); a negative vocab
    means a separate classifier follows. Weights are fp32 in nn.Linear [out, in] orientation."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        header = f.read(HEADER.size)
        if len(header) < HEADER.size:
            raise ModelLoadError(f"{path}: too short to be a llama2.c checkpoint")
        dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len = HEADER.unpack(header)
        data = np.frombuffer(f.read(), dtype=np.float32)
    shared = vocab > 0
    vocab = abs(vocab)
    if min(dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len) <= 0 or dim % n_heads:
        raise ModelLoadError(
            f"{path}: implausible llama2.c header {(dim, hidden, n_layers, n_heads, n_kv_heads, vocab, seq_len)}"
        )
    head_dim = dim // n_heads
    kv_dim = n_kv_heads * head_dim
    shapes = [
        ("embed", (vocab, dim)),
        ("rms_att", (n_layers, dim)),
        ("wq", (n_layers, dim, dim)),
        ("wk", (n_layers, kv_dim, dim)),
        ("wv", (n_layers, kv_dim, dim)),
        ("wo", (n_layers, dim, dim)),
        ("rms_ffn", (n_layers, dim)),
        ("w1", (n_layers, hidden, dim)),
        ("w2", (n_layers, dim, hidden)),
        ("w3", (n_layers, hidden, dim)),
        ("rms_final", (dim,)),
        ("freq_real", (seq_len, head_dim // 2)),
        ("freq_imag", (seq_len, head_dim // 2)),
    ]
    if not shared:
        shapes.append(("wcls", (vocab, dim)))
    needed = sum(int(np.prod(s)) for _, s in shapes)
    if data.size < needed:
        raise ModelLoadError(
            f"{path}: truncated llama2.c checkpoint ({size} bytes, header implies {HEADER.size + 4 * needed})"
        )
    arrays, offset = {}, 0
    for name, shape in shapes:
        n = int(np.prod(shape))
        arrays[name] = torch.from_numpy(data[offset : offset + n].copy()).reshape(shape)
        offset += n

    t: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": arrays["embed"],
        "model.norm.weight": arrays["rms_final"],
    }
    if not shared:
        t["lm_head.weight"] = arrays["wcls"]
    for i in range(n_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = arrays["rms_att"][i]
        t[p + "post_attention_layernorm.weight"] = arrays["rms_ffn"][i]
        t[p + "self_attn.q_proj.weight"] = rope_rows_to_half_split(arrays["wq"][i], n_heads)
        t[p + "self_attn.k_proj.weight"] = rope_rows_to_half_split(arrays["wk"][i], n_kv_heads)
        t[p + "self_attn.v_proj.weight"] = arrays["wv"][i]
        t[p + "self_attn.o_proj.weight"] = arrays["wo"][i]
        t[p + "mlp.gate_proj.weight"] = arrays["w1"][i]
        t[p + "mlp.down_proj.weight"] = arrays["w2"][i]
        t[p + "mlp.up_proj.weight"] = arrays["w3"][i]
    config = ModelConfig(
        architecture="llama",
        vocab_size=vocab,
        hidden_size=dim,
        intermediate_size=hidden,
        num_layers=n_layers,
        num_heads=n_heads,
        num_kv_heads=n_kv_heads,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        max_position_embeddings=seq_len,
        tie_word_embeddings=shared,
        bos_token_id=1,
        eos_token_ids=[2],
    )
    return Checkpoint(config, t, source=path, metadata={"format": "llama2c"})
