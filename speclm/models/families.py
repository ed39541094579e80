"""What sets the newer families apart from the llama block, as config fields (their GGUF tensor names are
in speclm/models/gguf_names.py):

- qwen3: per-head RMSNorm on q and k before rotary, no qkv bias, an explicit head_dim.
- gemma3: those q/k norms too, norms of the form (1 + weight) (folded into the weight when loading a Hugging
  Face file; llama.cpp's converter already stores 1 + weight), a norm after attention and around the MLP
  (4 per layer), GeGLU (tanh GELU), the embedding scaled by sqrt(hidden), the attention scale from
  query_pre_attn_scalar, and local (sliding window, their own rope base) layers between global ones.
- phi3 (Phi-3.5-mini, Phi-4-mini): the llama block with q/k/v and gate/up stored fused (split when loading,
  fused again when saving), LongRoPE (short and long per-frequency factors, an attention factor) and partial
  rotary (Phi-4-mini turns the first 3/4 of each head).

The decoder layer that runs qwen3 and gemma3 is speclm/models/variants.py (phi3 runs the llama block, its
C++ decoder included); config.py, the loaders and the savers call in here.
"""

from __future__ import annotations

import math

import torch

# Hugging Face class / model_type -> our architecture name, beyond llama, mistral and qwen2.
HF_CLASSES = {"Qwen3ForCausalLM": "qwen3", "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3"}
HF_MODEL_TYPES = {"qwen3": "qwen3", "gemma3_text": "gemma3", "phi3": "phi3"}
FAMILY_ARCHITECTURES = ("qwen3", "gemma3", "phi3")

SLIDING, FULL = "sliding_attention", "full_attention"
GEMMA3_SLIDING_PATTERN = 6  # llama.cpp (and transformers' default): every 6th layer is global
GEMMA3_LOCAL_ROPE_THETA = 10000.0


def gemma3_layer_types(num_layers: int, pattern: int = GEMMA3_SLIDING_PATTERN) -> list[str]:
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]


def hf_extras(arch: str, d: dict) -> dict:
    """ModelConfig fields a qwen3 / gemma3 / phi3 config.json sets beyond the llama ones."""
    if arch == "qwen3":
        return {"qk_norm": True, "attention_bias": bool(d.get("attention_bias", False))}
    if arch == "phi3":
        return _phi3_hf_extras(d)
    if arch != "gemma3":
        return {}
    num_layers = d["num_hidden_layers"]
    layer_types = d.get("layer_types") or gemma3_layer_types(num_layers, d.get("sliding_window_pattern", 6))
    rope = d.get("rope_parameters") or {}
    local = rope.get(SLIDING) or {}
    full = rope.get(FULL) or {}
    rope_scaling = full if full.get("rope_type", "default") != "default" else d.get("rope_scaling")
    head_dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
    return {
        "qk_norm": True,
        "sandwich_norms": True,
        "hidden_act": d.get("hidden_activation") or d.get("hidden_act") or "gelu_pytorch_tanh",
        "embedding_scale": math.sqrt(d["hidden_size"]),
        "attention_scale": float(d.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        "sliding_window": d.get("sliding_window"),
        "layer_types": list(layer_types),
        "rope_theta": full.get("rope_theta") or d.get("rope_theta") or 1000000.0,
        "rope_local_theta": local.get("rope_theta") or d.get("rope_local_base_freq") or GEMMA3_LOCAL_ROPE_THETA,
        "rope_scaling": rope_scaling or None,
        "final_logit_softcapping": d.get("final_logit_softcapping"),
        "attention_bias": bool(d.get("attention_bias", False)),
        "tie_word_embeddings": d.get("tie_word_embeddings", True),
        "norms_add_one": True,
    }


def hf_dict_extras(config) -> dict:
    """The config.json keys of a qwen3 / gemma3 / phi3 ModelConfig beyond the llama ones (to_hf_dict)."""
    if config.architecture == "qwen3":
        return {"attention_bias": config.attention_bias}
    if config.architecture == "phi3":
        scaling = config.rope_scaling
        # (pad_token_id: Phi3Config's default is Phi-3's, outside another vocabulary; speclm does not pad)
        out = {"partial_rotary_factor": config.rotary_dim / config.head_dim, "pad_token_id": None}
        if scaling and scaling.get("rope_type") == "longrope":
            out["original_max_position_embeddings"] = scaling["original_max_position_embeddings"]
            keep = ("short_factor", "long_factor", "attention_factor")
            out["rope_scaling"] = {"rope_type": "longrope"} | {k: scaling[k] for k in keep}
        return out
    if config.architecture != "gemma3":
        return {}
    return {
        "model_type": "gemma3_text",
        "hidden_activation": config.hidden_act,
        "query_pre_attn_scalar": _whole(config.attention_scale**-2),  # (transformers takes an int)
        "sliding_window": config.sliding_window,
        "layer_types": config.layer_types,
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": config.rope_local_theta},
            FULL: (config.rope_scaling or {"rope_type": "default"}) | {"rope_theta": config.rope_theta},
        },
        "final_logit_softcapping": config.final_logit_softcapping,
    }


def _whole(x: float) -> int | float:
    return round(x) if abs(x - round(x)) < 1e-6 else x


# -- phi3 ----------------------------------------------------------------------------------------


def _phi3_hf_extras(d: dict) -> dict:
    rope = d.get("rope_parameters") if isinstance(d.get("rope_parameters"), dict) else {}
    head_dim = d.get("head_dim") or d["hidden_size"] // d["num_attention_heads"]
    partial = d.get("partial_rotary_factor") or rope.get("partial_rotary_factor") or 1.0
    scaling = d.get("rope_scaling") or rope
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    out = {"rotary_dim": int(head_dim * partial), "rope_scaling": None}
    if kind in ("su", "longrope"):  # ("su": LongRoPE's first name)
        max_positions = d.get("max_position_embeddings", 4096)
        original = d.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
        original = original or max_positions
        attention = scaling.get("attention_factor")
        if attention is None:  # transformers' and llama.cpp's default, from the context's growth
            factor = scaling.get("factor") or max_positions / original
            attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        out["rope_scaling"] = longrope(scaling["short_factor"], scaling["long_factor"], original, attention)
    elif kind not in ("default", None):
        raise ValueError(f"unsupported phi3 rope_scaling type {kind!r} (supported: longrope)")
    return out


def longrope(short_factor, long_factor, original: int, attention_factor: float) -> dict:
    """LongRoPE's rope_scaling: per-frequency divisors for a context up to `original` positions (short) and
    past it (long), and the factor cos and sin are multiplied by (speclm/models/rope.py)."""
    return {
        "rope_type": "longrope",
        "short_factor": [float(x) for x in short_factor],
        "long_factor": [float(x) for x in long_factor],
        "original_max_position_embeddings": int(original),
        "attention_factor": float(attention_factor),
    }


def fused_parts(config) -> dict[str, list[tuple[str, int]]]:
    """Per layer, the tensors a family's files store fused (phi3: qkv_proj, gate_up_proj): the fused name's
    suffix -> (the suffix of each part in speclm's Checkpoint, its rows), in row order."""
    if config.architecture != "phi3":
        return {}
    q, kv, ff = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim, config.intermediate_size
    qkv = [("self_attn.q_proj.weight", q), ("self_attn.k_proj.weight", kv), ("self_attn.v_proj.weight", kv)]
    gate_up = [("mlp.gate_proj.weight", ff), ("mlp.up_proj.weight", ff)]
    return {"self_attn.qkv_proj.weight": qkv, "mlp.gate_up_proj.weight": gate_up}


def unfuse_tensors(config, tensors: dict) -> dict:
    """A file's tensors under speclm's Checkpoint names: fused tensors split into their parts (views)."""
    fused = fused_parts(config)
    if not fused:
        return tensors
    out = {}
    for name, tensor in tensors.items():
        prefix, _, suffix = name.rpartition("layers.")
        index, _, rest = suffix.partition(".")
        if not prefix or rest not in fused:
            out[name] = tensor
            continue
        parts = fused[rest]
        for (part, _), piece in zip(parts, tensor.split([rows for _, rows in parts])):
            out[f"{prefix}layers.{index}.{part}"] = piece
    return out


def fuse_tensors(config, tensors: dict) -> dict:
    """The inverse of unfuse_tensors: the parts of each fused tensor concatenated under its file name."""
    fused = fused_parts(config)
    if not fused:
        return dict(tensors)
    out = dict(tensors)
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        for name, parts in fused.items():
            if all(p + part in out for part, _ in parts):
                out[p + name] = torch.cat([out.pop(p + part) for part, _ in parts])
    return out


# -- the tensors of a Hugging Face file ------------------------------------------------------------


def from_hf_tensors(config, tensors: dict) -> dict:
    """A Hugging Face file's tensors as speclm's Checkpoint holds them: fused ones split (phi3), gemma's
    norms stored as 1 + weight (as llama.cpp's GGUFs are). Clears config.norms_add_one."""
    tensors = unfuse_tensors(config, tensors)
    if config.norms_add_one:
        tensors = {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in tensors.items()}
        config.norms_add_one = False
    return tensors


def to_hf_tensors(config, tensors: dict, fuse: bool = True) -> dict:
    """The inverse of from_hf_tensors, for saving: what transformers reads for this architecture. `fuse`
    False keeps the parts apart (a quantized checkpoint's, whose scales are per part: speclm reads both)."""
    tensors = fuse_tensors(config, tensors) if fuse else dict(tensors)
    if config.architecture == "gemma3":  # (1 + weight) norms: the file holds the weight
        tensors = {k: v - 1.0 if k.endswith("norm.weight") else v for k, v in tensors.items()}
    return tensors


# -- GGUF ----------------------------------------------------------------------------------------

# Their GGUF tensor names (where a family's differ from llama's) are gguf_names.FAMILY_LAYER_NAMES.


def gguf_extras(arch: str, get, num_layers: int, head_dim: int) -> dict:
    """ModelConfig fields a qwen3 / gemma3 GGUF's metadata sets (`get` reads `{arch}.KEY`)."""
    if arch == "qwen3":
        return {"qk_norm": True}
    if arch != "gemma3":
        return {}
    window = get("attention.sliding_window")
    hidden = int(get("embedding_length"))
    softcap = get("final_logit_softcapping")
    return {
        "qk_norm": True,
        "sandwich_norms": True,
        "hidden_act": "gelu_pytorch_tanh",
        "embedding_scale": math.sqrt(hidden),
        # llama.cpp: 1/sqrt(head_dim) for every gemma3 but the 27B (which uses hidden/heads)
        "attention_scale": head_dim**-0.5,
        "sliding_window": int(window) if window else None,
        "layer_types": gemma3_layer_types(num_layers) if window else None,
        "rope_local_theta": GEMMA3_LOCAL_ROPE_THETA,
        "final_logit_softcapping": float(softcap) if softcap else None,
    }


# -- tokenizer -----------------------------------------------------------------------------------

# Gemma 3's chat template (its tokenizer_config.json's), for GGUF files that do not carry one (the
# Gemma-3-270M GGUF does not): a system message prefixes the first user turn; the assistant is "model".
GEMMA3_CHAT_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""
DEFAULT_CHAT_TEMPLATES = {"gemma3": GEMMA3_CHAT_TEMPLATE}
# Tokens that end generation as EOS does wherever a GGUF's vocabulary has them, named or not (llama.cpp's
# end-of-generation set, and transformers' generation_config for these models: Qwen2.5's instruct models
# end a turn with <|im_end|> but may follow a tool call with <|endoftext|>).
END_OF_GENERATION_TOKENS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
)
