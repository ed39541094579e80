"""Helpers for tests: tiny random Hugging Face llama-family models and running them next to ours."""

from __future__ import annotations

import torch

from speclm.models.attention import AttentionMetadata
from speclm.models.builder import build_model
from speclm.models.loader import load_checkpoint

TINY = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
)


def tiny_hf_model(config_class, seed: int = 0, **overrides):
    """A random fp32 HF model whose every weight (norms and biases included) is non-trivial."""
    torch.manual_seed(seed)
    from transformers import AutoModelForCausalLM

    config = config_class(**{**TINY, **overrides})
    model = AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model.eval()


def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """Transformers' logits for every position of `ids`, no cache: [len(ids), vocab]."""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def our_logits_through_cache(model, prompt: list[int], steps: list[list[int]]) -> list[torch.Tensor]:
    """Prefill `prompt`, then feed each chunk of `steps` through the KV cache; logits per call."""
    total = len(prompt) + sum(len(s) for s in steps)
    cache = model.new_cache(total)
    out, start = [], 0
    for chunk in [prompt] + steps:
        n = len(chunk)
        hidden = model(torch.tensor(chunk), torch.arange(start, start + n), cache, AttentionMetadata(start, n))
        out.append(model.compute_logits(hidden))  # [n, vocab]
        start += n
        cache.truncate(start)
    return out


def load_ours(path: str):
    return build_model(load_checkpoint(path))
