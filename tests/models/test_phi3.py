"""phi3 (speclm/models/families.py) against transformers on tiny random checkpoints: fused q/k/v and gate/up,
LongRoPE (short and long factors, the attention factor) and partial rotary, through safetensors and GGUF
(as llama.cpp's converter writes the family), fp32 logits within 1e-4 and 32 greedy tokens with and without
speculation."""

from __future__ import annotations

import math

import pytest
import torch

from speclm.compress.gguf_export import export_gguf
from speclm.models.builder import build_model
from speclm.models.config import ModelConfig
from speclm.models.gguf_loader import load_gguf
from speclm.models.gguf_weights import native_kernels
from speclm.models.loader import load_checkpoint
from tests.models.hf_tiny import hf_logits, load_ours, tiny_hf_model
from tests.models.test_families import TOL, _check, _greedy_follows_transformers, _ids, _word_tokenizer

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")


def _longrope(rotary_dim: int) -> dict:
    half = rotary_dim // 2
    return {
        "rope_type": "longrope",
        "short_factor": [1.0 + 0.1 * i for i in range(half)],
        "long_factor": [1.5 + 0.7 * i for i in range(half)],
    }


# head_dim 16 (hidden 64, 4 heads). Past the original context (16 < 256): the long factors and an attention
# factor from the context's growth, on the 32-token sequences below (transformers takes the long factors for
# a sequence past the original context).
PHI35 = dict(original_max_position_embeddings=16, rope_scaling=_longrope(16))  # untied, every dim turns
PHI4_MINI = dict(  # tied, partial rotary: 12 of 16 dims
    original_max_position_embeddings=16,
    partial_rotary_factor=0.75,
    rope_scaling=_longrope(12),
    tie_word_embeddings=True,
)
# A context within the original one: the short factors, with an explicit attention factor.
SHORT = dict(
    max_position_embeddings=64,
    original_max_position_embeddings=64,
    partial_rotary_factor=0.5,
    rope_scaling=_longrope(8) | {"attention_factor": 1.2},
)
CASES = {"phi3.5": PHI35, "phi4-mini": PHI4_MINI, "short-context": SHORT}


IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=None)  # (Phi3Config's defaults are Phi-3's 32k vocabulary)


def _phi3(case: str, **changes):
    return tiny_hf_model(transformers.Phi3Config, **(IDS | CASES[case] | changes))


@pytest.mark.parametrize("case", list(CASES))
def test_safetensors_logits_match_transformers(case, tmp_path):
    hf_model = _phi3(case)
    hf_model.save_pretrained(tmp_path)
    checkpoint = load_checkpoint(str(tmp_path))
    config = checkpoint.config
    assert config.architecture == "phi3" and not config.is_variant  # the llama block (and its C++ decoder)
    assert config.rotary_dim == int(16 * CASES[case].get("partial_rotary_factor", 1.0))
    assert "model.layers.1.self_attn.k_proj.weight" in checkpoint.tensors  # (split from qkv_proj)
    _check(hf_model, load_ours(str(tmp_path)))


def test_longrope_factors_and_partial_rotary_matter():
    """The quirks are switched on: without them the logits leave transformers' (the checks above can fail)."""
    hf_model = _phi3("phi4-mini")
    ids = _ids(hf_model.config.vocab_size)
    reference = hf_logits(hf_model, ids)
    for change in ({"partial_rotary_factor": 1.0, "rope_scaling": _longrope(16)}, {"rope_scaling": None}):
        other = _phi3("phi4-mini", **change)
        assert (hf_logits(other, ids) - reference).abs().max() > 100 * TOL


def test_config_json_of_the_real_models():
    """Phi-3.5-mini's and Phi-4-mini's config.json (transformers 4's layout: rope_scaling "longrope" with its
    factors, original_max_position_embeddings beside it): partial rotary, the long factors for their 128k
    context and the attention factor transformers and llama.cpp compute."""
    base = {
        "architectures": ["Phi3ForCausalLM"],
        "model_type": "phi3",
        "vocab_size": 32064,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "sliding_window": 262144,
        "rope_scaling": {"type": "longrope", "short_factor": [1.0] * 48, "long_factor": [2.0] * 48},
    }
    phi35 = ModelConfig.from_hf_dict(base)
    phi4 = ModelConfig.from_hf_dict(
        base | {"num_attention_heads": 24, "num_key_value_heads": 8, "partial_rotary_factor": 0.75}
    )
    expected = math.sqrt(1 + math.log(32) / math.log(4096))
    for config, rotary in ((phi35, 96), (phi4, 96)):
        assert config.rotary_dim == rotary and config.max_position_embeddings == 131072
        assert config.rope_scaling["original_max_position_embeddings"] == 4096
        assert config.rope_scaling["attention_factor"] == pytest.approx(expected)
    assert phi4.head_dim == 128
    from speclm.models.rope import rope_inverse_frequencies

    inv_freq, attention = rope_inverse_frequencies(phi4)
    assert inv_freq.shape == (48,) and attention == pytest.approx(expected)
    assert inv_freq[0].item() == pytest.approx(0.5)  # theta^0 / the long factor 2


@pytest.mark.parametrize("case", ["phi3.5", "phi4-mini"])
def test_save_writes_what_transformers_reads(case, tmp_path):
    """speclm's save path (quantize, prune, distill, merge) writes phi3 as transformers stores it: q/k/v and
    gate/up fused, the rope parameters in config.json; transformers' logits from it are the original's."""
    from speclm.compress.model_io import model_to_tensors, rebuild
    from speclm.compress.save import save_checkpoint

    hf_model = _phi3(case)
    hf_model.save_pretrained(tmp_path / "src")
    _word_tokenizer(tmp_path / "src", hf_model.config.vocab_size)
    from speclm.compress.model_io import load_with_tokenizer

    checkpoint, tokenizer = load_with_tokenizer(str(tmp_path / "src"))
    save_checkpoint(str(tmp_path / "out"), checkpoint.config, model_to_tensors(rebuild(checkpoint)), tokenizer)
    from safetensors import safe_open

    with safe_open(str(tmp_path / "out" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.qkv_proj.weight" in names and "model.layers.0.mlp.gate_up_proj.weight" in names
    assert not any("q_proj" in n or "gate_proj" in n for n in names)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager")
    ids = _ids(hf_model.config.vocab_size)
    assert (hf_logits(reloaded, ids) - hf_logits(hf_model, ids)).abs().max() <= TOL
    _check(hf_model, load_ours(str(tmp_path / "out")))


def test_greedy_with_and_without_speculation_follows_transformers(tmp_path):
    hf_model = _phi3("phi4-mini")
    hf_model.save_pretrained(tmp_path)
    _word_tokenizer(tmp_path, hf_model.config.vocab_size)
    _greedy_follows_transformers(hf_model, str(tmp_path), str(tmp_path), "fp32")


def _export(tmp_path, case: str, tensor_type: str) -> tuple[object, str]:
    hf_model = _phi3(case)
    hf_model.save_pretrained(tmp_path)
    path = str(tmp_path / f"{case}-{tensor_type}.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, path, tensor_type)
    return hf_model, path


def test_gguf_is_written_as_llama_cpp_names_and_reads_it(tmp_path):
    """The tensors carry the names gguf's own table gives Phi3ForCausalLM's (what llama.cpp's converter
    writes: attn_qkv, ffn_up holding gate then up, rope_factors_long/short), with its metadata keys."""
    hf_model, path = _export(tmp_path, "phi4-mini", "F32")
    reader = gguf.GGUFReader(path)
    names = {t.name for t in reader.tensors}
    table = gguf.get_tensor_name_map(gguf.MODEL_ARCH.PHI3, 2)
    for hf_name, _ in hf_model.named_parameters():
        if hf_name == "lm_head.weight":
            continue  # tied: llama.cpp omits output.weight
        stem = hf_name.rsplit(".", 1)[0]
        assert table.get_name(stem) + ".weight" in names, hf_name
    assert {"rope_factors_long.weight", "rope_factors_short.weight"} <= names and "output.weight" not in names
    fields = {f.name: f for f in reader.fields.values()}
    arch = "phi3"
    assert fields["general.architecture"].contents() == arch
    assert fields[f"{arch}.rope.dimension_count"].contents() == 12
    assert fields[f"{arch}.rope.scaling.original_context_length"].contents() == 16
    expected = math.sqrt(1 + math.log(256 / 16) / math.log(16))
    assert fields[f"{arch}.rope.scaling.attn_factor"].contents() == pytest.approx(expected)
    assert f"{arch}.attention.key_length" not in fields  # (head_dim is hidden / heads)
    config = load_gguf(path).config
    assert config.rotary_dim == 12 and config.head_dim == 16 and config.tie_word_embeddings


@pytest.mark.parametrize("case", ["phi3.5", "phi4-mini"])
def test_gguf_logits_match_transformers(case, tmp_path):
    """F32 within 1e-4 of transformers; Q8_0 within its quantization error on its own grids (--weights auto,
    the llama block's C++ decoder where the kernels run)."""
    hf_model, f32 = _export(tmp_path, case, "F32")
    _check(hf_model, load_ours(f32))
    q8 = str(tmp_path / "q8.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, q8, "Q8_0")
    from tests.models.hf_tiny import our_logits_through_cache

    ids = _ids(hf_model.config.vocab_size)
    reference = hf_logits(hf_model, ids)
    native = build_model(load_checkpoint(q8), weights="auto")
    native.use_lean_ops()
    if native_kernels() is not None:  # (AVX-512 VNNI or AVX2): the llama block's C++ decoder, partial rotary included
        assert native.native_decoder is not None
    got = torch.cat(our_logits_through_cache(native, ids[:11], [[t] for t in ids[11:27]] + [ids[27:]]))
    assert (got - reference).abs().max() <= 0.5


def test_gguf_greedy_with_and_without_speculation(tmp_path):
    hf_model, path = _export(tmp_path, "phi3.5", "F32")
    _word_tokenizer(tmp_path, hf_model.config.vocab_size)
    _greedy_follows_transformers(hf_model, path, str(tmp_path), "auto")
