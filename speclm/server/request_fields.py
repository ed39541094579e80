"""Request fields beyond the ones the request schemas implement: what other servers' clients send (OpenAI's,
vLLM's, llama-server's) is served where it asks for nothing, refused by name where it asks for something
this server does not do, and any other field is refused as unrecognized (as OpenAI answers). None is
silently ignored."""

from __future__ import annotations

from speclm.server.errors import APIError

# Fields that change nothing in what is generated or returned, with any value: tags, bookkeeping and
# hints about caching or placement (this server caches prefixes on its own and has one queue).
WITHOUT_EFFECT = frozenset(
    {
        # OpenAI
        "user",
        "store",
        "metadata",
        "service_tier",
        "safety_identifier",
        "prompt_cache_key",
        "prompt_cache_retention",
        "prompt_cache_options",
        # vLLM
        "request_id",
        "guided_decoding_backend",
        # llama-server
        "cache_prompt",
        "id_slot",
        "slot_id",
        # llama-server: settings of samplers that are off unless their own field (refused below) turns them on
        "repeat_last_n",
        "penalize_nl",
        "mirostat_tau",
        "mirostat_eta",
        "dry_base",
        "dry_allowed_length",
        "dry_penalty_last_n",
        "dry_sequence_breakers",
        "xtc_threshold",
        "dynatemp_exponent",
        "min_keep",
    }
)

# Fields this server does not implement, with the values that ask for nothing (their defaults): a
# request giving one of these (or null) is served as if it had left the field out; any other value is
# refused, naming the field. A field with no such value here is served only when null.
NOT_IMPLEMENTED: dict[str, tuple] = {
    # OpenAI
    "logit_bias": ({},),
    "best_of": (1,),
    "echo": (False,),
    "suffix": ("",),
    "functions": ([],),
    "function_call": ("none",),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
    "verbosity": (),
    "web_search_options": (),
    "moderation": (),
    # vLLM
    "use_beam_search": (False,),
    "length_penalty": (1,),
    "min_tokens": (0,),
    "stop_token_ids": ([],),
    "bad_words": ([],),
    "allowed_token_ids": (),
    "include_stop_str_in_output": (False,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "truncate_prompt_tokens": (),
    "prompt_logprobs": (),
    "logits_processors": (),
    "return_tokens_as_token_ids": (False,),
    "return_token_ids": (False,),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "add_special_tokens": (),
    "chat_template": (),
    "chat_template_kwargs": ({},),
    "documents": (),
    "mm_processor_kwargs": (),
    "structural_tag": (),
    "guided_whitespace_pattern": (),
    "priority": (0,),
    "cache_salt": (),
    "kv_transfer_params": (),
    "vllm_xargs": (),
    # llama-server
    "n_probs": (0,),
    "typical_p": (1,),
    "typ_p": (1,),
    "repeat_penalty": (1,),
    "mirostat": (0,),
    "tfs_z": (1,),
    "dry_multiplier": (0,),
    "xtc_probability": (0,),
    "dynatemp_range": (0,),
    "samplers": (),
    "grammar": (),
    "json_schema": (),
    "n_keep": (0,),
    "n_discard": (0,),
    "n_indent": (0,),
    "t_max_predict_ms": (0,),
    "return_tokens": (False,),
    "timings_per_token": (False,),
    "post_sampling_probs": (False,),
    "response_fields": (),
    "image_data": (),
    "lora": (),
}


def _same(value: object, neutral: object) -> bool:
    """JSON equality: 1 and 1.0 are one number, but true is not 1."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    if isinstance(value, (int, float)) and isinstance(neutral, (int, float)):
        return value == neutral
    return type(value) is type(neutral) and value == neutral


def check_extra_fields(extra: dict[str, object]) -> None:
    """APIError 400 naming the first of a request's fields outside its schema (`extra`) that asks for
    something this server does not do, or that no API we follow defines."""
    for name, value in extra.items():
        if name in WITHOUT_EFFECT:
            continue
        if name not in NOT_IMPLEMENTED:
            raise APIError(400, f"unrecognized request argument: {name}", param=name)
        if value is not None and not any(_same(value, neutral) for neutral in NOT_IMPLEMENTED[name]):
            raise APIError(400, f"{name} is not supported by this server", param=name)
