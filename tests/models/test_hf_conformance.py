"""Our forward (through the KV cache) equals Hugging Face transformers' on tiny random HF checkpoints."""

from __future__ import annotations

import json
import os

import pytest
import torch

from speclm.models.checkpoint import ModelLoadError
from speclm.models.config import ModelConfig
from speclm.models.loader import load_checkpoint
from tests.models.hf_tiny import hf_logits, load_ours, our_logits_through_cache, tiny_hf_model

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
CASES = {
    "llama-gqa-untied": ("LlamaConfig", {}),
    "llama-mha-tied": ("LlamaConfig", {"num_key_value_heads": 4, "tie_word_embeddings": True}),
    "llama-llama3-rope": ("LlamaConfig", {"rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0}),
    "llama-linear-rope": ("LlamaConfig", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama-head-dim-32": ("LlamaConfig", {"head_dim": 32}),
    "qwen2-yarn-rope": (
        "Qwen2Config",
        {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}},
    ),
    "qwen2-bias-tied": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen2-bias-untied-mqa": ("Qwen2Config", {"num_key_value_heads": 1, "rope_theta": 1000000.0}),
    "mistral-gqa": ("MistralConfig", {}),
}
TOL = 1e-4


def _check_against_hf(hf_model, path: str) -> None:
    """Prefill 11 tokens, 16 single-token decode steps, then one 5-token chunk (speculative verify shape)."""
    ours = load_ours(path)
    g = torch.Generator().manual_seed(1)
    vocab = hf_model.config.vocab_size
    ids = torch.randint(0, vocab, (11 + 16 + 5,), generator=g).tolist()
    prompt, steps = ids[:11], [[t] for t in ids[11:27]] + [ids[27:]]
    expected = hf_logits(hf_model, ids)  # [32, vocab]
    got = torch.cat(our_logits_through_cache(ours, prompt, steps))  # [32, vocab]
    assert got.shape == expected.shape
    assert expected.abs().max() > 1.0  # the comparison is not between near-zero logits
    diff = (got - expected).abs().max().item()
    assert diff <= TOL, f"max abs logit diff {diff}"
    # greedy choices agree everywhere, not only within tolerance
    assert torch.equal(got.argmax(-1), expected.argmax(-1))


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers_prefill_and_decode(case, tmp_path):
    class_name, overrides = CASES[case]
    hf_model = tiny_hf_model(getattr(transformers, class_name), **overrides)
    hf_model.save_pretrained(tmp_path, safe_serialization=True)
    assert any(f.endswith(".safetensors") for f in os.listdir(tmp_path))
    if class_name == "Qwen2Config":
        bias = hf_model.model.layers[0].self_attn.q_proj.bias
        assert bias.abs().min() > 0  # biases really take part
    _check_against_hf(hf_model, str(tmp_path))


def test_rope_settings_read_from_saved_config(tmp_path):
    """transformers 5 writes rope settings under rope_parameters; older files use rope_theta/rope_scaling."""
    hf_model = tiny_hf_model(transformers.LlamaConfig, rope_scaling=LLAMA3_ROPE, rope_theta=500000.0)
    hf_model.save_pretrained(tmp_path)
    config = load_checkpoint(str(tmp_path)).config
    assert config.rope_theta == 500000.0
    assert config.rope_scaling["rope_type"] == "llama3" and config.rope_scaling["factor"] == 8.0
    assert config.rope_scaling["original_max_position_embeddings"] == 32
    old_style = {
        **json.load(open(tmp_path / "config.json")),
        "rope_theta": 250000.0,
        "rope_scaling": {"type": "linear", "factor": 2.0},
    }
    old_style.pop("rope_parameters", None)
    old = ModelConfig.from_hf_dict(old_style)
    assert old.rope_theta == 250000.0 and old.rope_scaling == {"type": "linear", "factor": 2.0}
    default = ModelConfig.from_hf_dict(
        {
            **old_style,
            "rope_scaling": None,
            "rope_theta": None,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
        }
    )
    assert default.rope_theta == 1e6 and default.rope_scaling is None


def test_to_hf_dict_round_trips_through_transformers(tmp_path):
    """ModelConfig.to_hf_dict() is a config transformers reads back to the same model."""
    hf_model = tiny_hf_model(transformers.Qwen2Config, tie_word_embeddings=True)
    hf_model.save_pretrained(tmp_path)
    config = load_checkpoint(str(tmp_path)).config
    again = ModelConfig.from_hf_dict(
        transformers.AutoConfig.for_model(**config.to_hf_dict()).to_dict() | {"architectures": ["Qwen2ForCausalLM"]}
    )
    assert again == config


def test_llama_attention_bias_includes_o_proj(tmp_path):
    """Llama's attention_bias puts biases on q/k/v AND o_proj (unlike qwen2); all four must be applied."""
    hf_model = tiny_hf_model(transformers.LlamaConfig, attention_bias=True)
    hf_model.save_pretrained(tmp_path)
    _check_against_hf(hf_model, str(tmp_path))


def test_unsupported_tensors_are_refused_not_dropped(tmp_path):
    """Llama's mlp_bias is not implemented: loading must fail naming the tensor, not ignore it."""
    hf_model = tiny_hf_model(transformers.LlamaConfig, mlp_bias=True)
    hf_model.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"mlp\.down_proj\.bias"):
        load_ours(str(tmp_path))


def test_sliding_window_limits_the_context(tmp_path):
    """We do full attention, so a Mistral window shorter than the context becomes the usable context
    (prompts beyond it are refused) instead of silently attending past the window."""
    hf_model = tiny_hf_model(transformers.MistralConfig, sliding_window=16)
    hf_model.save_pretrained(tmp_path)
    assert load_checkpoint(str(tmp_path)).config.max_position_embeddings == 16
    unused = tiny_hf_model(transformers.Qwen2Config, sliding_window=16, use_sliding_window=False)
    unused.save_pretrained(tmp_path / "qwen2")
    assert load_checkpoint(str(tmp_path / "qwen2")).config.max_position_embeddings == 256


def test_bf16_and_sharded_checkpoints(tmp_path):
    """bf16 safetensors are upcast exactly, and a checkpoint split over several shards loads whole."""
    hf_model = tiny_hf_model(transformers.Qwen2Config).to(torch.bfloat16)
    hf_model.save_pretrained(tmp_path, max_shard_size="100KB")
    shards = [f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]
    assert len(shards) > 1
    checkpoint = load_checkpoint(str(tmp_path))
    assert all(t.dtype == torch.float32 for t in checkpoint.tensors.values())
    # transformers' own fp32 load of the bf16 files (hf_model.float() would keep a bf16-rounded rope table)
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    _check_against_hf(reference, str(tmp_path))
