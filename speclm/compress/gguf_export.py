"""Write a Checkpoint (and optionally its tokenizer) as a GGUF file the way llama.cpp's converter does."""

from __future__ import annotations

import json
import re

import numpy as np

import speclm.models.families as families
from speclm.models.checkpoint import Checkpoint
from speclm.models.gguf_loader import half_split_to_rope_rows
from speclm.models.gguf_names import gguf_name

EXPORT_TENSOR_TYPES = ("F32", "F16", "Q8_0")
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def export_gguf(checkpoint: Checkpoint, tokenizer, path: str, tensor_type: str = "F32") -> list[str]:
    """Write `checkpoint` to `path` as GGUF (architecture llama, qwen2, qwen3, gemma3 or phi3; mistral is
    written as llama).

    tokenizer: a speclm Tokenizer with a byte-level BPE backend, or None to write weights only.
    tensor_type: "F32", "F16" or "Q8_0" for the 2-D weight matrices; norms and biases stay F32 as
    in llama.cpp. Q8_0 needs rows that are a multiple of 32 long; other matrices are written F16, as
    llama.cpp's converter does, and their GGUF names are returned. Llama Q/K rows are permuted to
    llama.cpp's interleaved RoPE layout; the other families' are written as they are (llama.cpp uses NEOX
    rope there). phi3's q/k/v and gate/up are written fused (attn_qkv, ffn_up), as llama.cpp's converter does.
    """
    import gguf

    if tensor_type not in EXPORT_TENSOR_TYPES:
        raise ValueError(
            f"unsupported GGUF export tensor type {tensor_type!r} (supported: {', '.join(EXPORT_TENSOR_TYPES)})"
        )
    config = checkpoint.config
    if config.attention_output_bias:
        raise ValueError("GGUF export of attention output biases is not supported")
    arch = config.architecture if config.architecture in ("qwen2", *families.FAMILY_ARCHITECTURES) else "llama"
    writer = gguf.GGUFWriter(path, arch)
    writer.add_name(str(checkpoint.metadata.get("name", "speclm export")))
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.rotary_dim)
    if config.head_dim * config.num_heads != config.hidden_size:
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(
        {
            "F32": gguf.LlamaFileType.ALL_F32,
            "F16": gguf.LlamaFileType.MOSTLY_F16,
            "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
        }[tensor_type]
    )
    _add_rope_scaling(writer, checkpoint)
    if arch == "gemma3":
        _add_gemma3(writer, config)
    if arch == "phi3":
        writer.add_sliding_window(0)  # (llama.cpp runs phi3 without a window whatever this says)
    if config.bos_token_id is not None:
        writer.add_bos_token_id(config.bos_token_id)
    if config.eos_token_ids:
        writer.add_eos_token_id(config.eos_token_ids[0])
    if tokenizer is not None:
        _add_tokenizer(writer, tokenizer)

    as_f16: list[str] = []
    tensors = checkpoint.tensors
    if families.fused_parts(config):  # (phi3: q/k/v and gate/up as one tensor each)
        tensors = families.fuse_tensors(config, {name: tensors[name] for name in tensors})
    for name, tensor in tensors.items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # llama.cpp omits output.weight when it is the embedding
        w = tensor.detach().float()
        if arch == "llama" and name.endswith(("self_attn.q_proj.weight", "self_attn.k_proj.weight")):
            w = half_split_to_rope_rows(w, config.num_heads if "q_proj" in name else config.num_kv_heads)
        if _add_tensor(writer, gguf, gguf_name(name, arch), w.numpy(), tensor_type):
            as_f16.append(gguf_name(name, arch))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return as_f16


def _add_tensor(writer, gguf, name: str, array: np.ndarray, tensor_type: str) -> str | None:
    """Add one tensor; returns its name when Q8_0 was asked for but it was written F16."""
    array = np.ascontiguousarray(array, dtype=np.float32)
    if array.ndim < 2 or tensor_type == "F32":
        writer.add_tensor(name, array)
    elif tensor_type == "F16":
        writer.add_tensor(name, array.astype(np.float16))
    else:
        if array.shape[-1] % 32:  # as llama.cpp's converter does: rows that do not fill Q8_0 blocks go F16
            writer.add_tensor(name, array.astype(np.float16))
            return name
        kind = gguf.GGMLQuantizationType.Q8_0
        writer.add_tensor(name, gguf.quants.quantize(array, kind), raw_dtype=kind)


def _add_gemma3(writer, config) -> None:
    """gemma3's metadata; what llama.cpp fixes for the family (every 6th layer global, the local rope base
    10000, the attention scale 1/sqrt(head_dim)) is checked, not written."""
    expected = families.gemma3_layer_types(config.num_layers) if config.sliding_window else None
    if config.layer_types is not None and config.sliding_window and config.layer_types != expected:
        raise ValueError("GGUF gemma3 has every 6th layer global; this model's layer_types differ")
    if config.rope_local_theta not in (None, families.GEMMA3_LOCAL_ROPE_THETA):
        raise ValueError(f"GGUF gemma3 has local rope base 10000, not {config.rope_local_theta}")
    if config.attention_scale is not None and abs(config.attention_scale * config.head_dim**0.5 - 1) > 1e-6:
        raise ValueError("GGUF gemma3 scales attention by 1/sqrt(head_dim), unlike this model's query_pre_attn_scalar")
    if config.sliding_window:
        writer.add_sliding_window(config.sliding_window)
    if config.final_logit_softcapping:
        writer.add_final_logit_softcapping(config.final_logit_softcapping)


def _add_rope_scaling(writer, checkpoint: Checkpoint) -> None:
    """linear/yarn go in metadata; llama3 becomes llama.cpp's rope_freqs tensor of frequency divisors; LongRoPE
    its rope_factors_long/short tensors with the original context and the attention factor in metadata."""
    import gguf

    scaling = checkpoint.config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("default", None):
        return
    if kind in ("linear", "yarn"):
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR if kind == "linear" else gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(float(scaling["factor"]))
        if "original_max_position_embeddings" in scaling:
            writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
        return
    if kind == "longrope":  # phi3, as llama.cpp's converter writes it
        writer.add_rope_scaling_orig_ctx_len(int(scaling["original_max_position_embeddings"]))
        writer.add_rope_scaling_attn_factors(float(scaling["attention_factor"]))
        writer.add_tensor("rope_factors_long.weight", np.array(scaling["long_factor"], dtype=np.float32))
        writer.add_tensor("rope_factors_short.weight", np.array(scaling["short_factor"], dtype=np.float32))
        return
    if kind in ("llama3", "freq_factors"):
        from speclm.models.rope import rope_inverse_frequencies, unscaled_inverse_frequencies

        scaled, _ = rope_inverse_frequencies(checkpoint.config)  # [rotary_dim/2]
        factors = unscaled_inverse_frequencies(checkpoint.config) / scaled.double()  # [rotary_dim/2]
        writer.add_tensor("rope_freqs.weight", factors.float().numpy())
        return
    raise ValueError(f"GGUF export of rope_scaling type {kind!r} is not supported")


def _add_tokenizer(writer, tokenizer) -> None:
    """tokenizer.ggml.* metadata: SentencePiece ("llama") or byte-level BPE ("gpt2")."""
    if tokenizer.sentencepiece is not None:
        _add_sentencepiece(writer, tokenizer)
        return
    spec = json.loads(tokenizer.backend.to_str())
    model = spec["model"]
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        raise ValueError(
            "GGUF tokenizer export supports byte-level BPE and SentencePiece (llama2.c/GGUF) tokenizers; "
            "this one came from a tokenizer.json with byte fallback: pass the original --tokenizer"
        )
    vocab: dict[str, int] = dict(model["vocab"])
    special = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if t.get("special")}
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", []) if not t.get("special")}
    vocab.update(special)
    vocab.update(added)
    tokens = [""] * (max(vocab.values()) + 1)
    for token, index in vocab.items():
        tokens[index] = token
    if "" in tokens:
        raise ValueError("tokenizer ids are not contiguous; cannot write a GGUF vocabulary")
    types = [3 if t in special else 4 if t in added else 1 for t in tokens]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(_pre_tokenizer_name(spec.get("pre_tokenizer")))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_add_bos_token(tokenizer.add_bos)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def _add_sentencepiece(writer, tokenizer) -> None:
    """A SentencePiece vocabulary as llama.cpp's "llama" tokenizer: pieces, scores and token types
    (unknown, control, byte-fallback <0xXX> and normal, the ids llama.cpp's llama2.c converter uses)."""
    pieces, scores, add_space_prefix = tokenizer.sentencepiece
    control = {tokenizer.bos_token_id, *tokenizer.eos_token_ids}
    unk = pieces.index("<unk>") if "<unk>" in pieces else None
    types = [
        2 if i == unk else 3 if i in control else 6 if _BYTE_PIECE.fullmatch(p) else 1 for i, p in enumerate(pieces)
    ]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    if unk is not None:
        writer.add_unk_token_id(unk)
    writer.add_add_bos_token(tokenizer.add_bos)
    writer.add_add_space_prefix(add_space_prefix)
    if tokenizer.chat_template:
        writer.add_chat_template(tokenizer.chat_template)


def _pre_tokenizer_name(pre: dict | None) -> str:
    """llama.cpp's tokenizer.ggml.pre name for the pre-tokenizers speclm builds from GGUF files."""
    from speclm.tokenizer import _SPLIT_BY_PRE

    text = json.dumps(pre or {})
    if '"Digits"' in text and '"individual_digits": true' in text:
        return "smollm"
    for name, regex in _SPLIT_BY_PRE.items():
        if json.dumps(regex)[1:-1] in text:
            return name
    return "gpt2"
