"""What sets the newer families apart from the llama block, as config fields (their GGUF tensor names are
in speclm/models/gguf_names.py):

- qwen3: per-head RMSNorm on q and k before rotary, no qkv bias, an explicit head_dim.
- gemma3: those q/k norms too, norms of the form (1 + weight) (folded into the weight when loading a Hugging
  Face file; llama.cpp's converter already stores 1 + weight), a norm after attention and around the MLP
  (4 per layer), GeGLU (tanh GELU), the embedding scaled by sqrt(hidden), the attention scale from
  query_pre_attn_scalar, and local (sliding window, their own rope base) layers between global ones.

The decoder layer that runs them is speclm/models/variants.py; config.py and the loaders call in here.
"""

from __future__ import annotations

import math

# Hugging Face class / model_type -> our architecture name, beyond llama, mistral and qwen2.
HF_CLASSES = {"Qwen3ForCausalLM": "qwen3", "Gemma3ForCausalLM": "gemma3"}
HF_MODEL_TYPES = {"qwen3": "qwen3", "gemma3_text": "gemma3"}
VARIANT_ARCHITECTURES = ("qwen3", "gemma3")

SLIDING, FULL = "sliding_attention", "full_attention"
GEMMA3_SLIDING_PATTERN = 6  # llama.cpp (and transformers' default): every 6th layer is global
GEMMA3_LOCAL_ROPE_THETA = 10000.0


def gemma3_layer_types(num_layers: int, pattern: int = GEMMA3_SLIDING_PATTERN) -> list[str]:
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(num_layers)]


def hf_extras(arch: str, d: dict) -> dict:
    """ModelConfig fields a qwen3 / gemma3 config.json sets beyond the llama ones."""
    if arch == "qwen3":
        return {"qk_norm": True, "attention_bias": bool(d.get("attention_bias", False))}
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
    """The config.json keys of a qwen3 / gemma3 ModelConfig beyond the llama ones (to_hf_dict)."""
    if config.architecture == "qwen3":
        return {"attention_bias": config.attention_bias}
    if config.architecture != "gemma3":
        return {}
    return {
        "model_type": "gemma3_text",
        "hidden_activation": config.hidden_act,
        "query_pre_attn_scalar": config.attention_scale**-2,
        "sliding_window": config.sliding_window,
        "layer_types": config.layer_types,
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": config.rope_local_theta},
            FULL: (config.rope_scaling or {"rope_type": "default"}) | {"rope_theta": config.rope_theta},
        },
        "final_logit_softcapping": config.final_logit_softcapping,
    }


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
END_OF_TURN_TOKENS = {"gemma3": "<end_of_turn>"}  # ends a reply as EOS does (llama.cpp stops there too)
