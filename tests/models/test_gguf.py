"""GGUF loading: tensor types dequantize correctly, llama/qwen2 GGUFs (written by export_gguf the way
llama.cpp does) match transformers and the original model, and the default SmolLM2 GGUF matches transformers."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from speclm.compress.gguf_export import export_gguf
from speclm.models.checkpoint import ModelLoadError
from speclm.models.gguf_file import GGUFFile
from speclm.models.gguf_loader import (
    dequantize_tensor,
    field_value,
    half_split_to_rope_rows,
    load_gguf,
    open_gguf,
    rope_rows_to_half_split,
)
from speclm.models.gguf_names import gguf_name, hf_name, layer_names
from speclm.models.loader import default_model_path, load_checkpoint
from speclm.sampling_params import SamplingParams
from tests.models.gguf_reference import dequantize_rows
from tests.models.hf_tiny import hf_logits, load_ours, our_logits_through_cache, tiny_hf_model

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
T = gguf.GGMLQuantizationType

ROWS, COLS = 3, 512


def _raw_tensor(kind: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """(what to hand GGUFWriter, the fp32 values it approximates or None for random K-quant blocks)."""
    x = rng.standard_normal((ROWS, COLS)).astype(np.float32)
    if kind == "F32":
        return x, x
    if kind == "F16":
        return x.astype(np.float16), x
    if kind in ("BF16", "Q8_0", "Q4_0", "Q4_1"):
        return gguf.quants.quantize(x, T[kind]), x
    # gguf-py cannot quantize K-quants: random blocks with sane fp16 super-block scales instead.
    size = gguf.GGML_QUANT_SIZES[T[kind]][1]
    blocks = rng.integers(0, 256, (ROWS * COLS // 256, size), dtype=np.uint8)
    scale = rng.uniform(0.001, 0.05, (blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if kind == "Q6_K":
        blocks[:, 208:210] = scale[:, :2]
    else:  # d then dmin lead the block
        blocks[:, 0:4] = scale
    return blocks.reshape(ROWS, -1), None


@pytest.fixture(scope="module")
def typed_gguf(tmp_path_factory):
    """One GGUF file holding a [3, 512] tensor of each supported type, plus what each should decode to."""
    rng = np.random.default_rng(0)
    path = str(tmp_path_factory.mktemp("types") / "types.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    raw = {}
    for kind in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "TQ1_0"):
        if kind == "TQ1_0":  # a real GGML type speclm does not support
            data, source = gguf.quants.quantize(rng.standard_normal((ROWS, COLS)).astype(np.float32), T.TQ1_0), None
        else:
            data, source = _raw_tensor(kind, rng)
        raw[kind] = (data, source)
        writer.add_tensor(kind, data, raw_dtype=None if kind in ("F32", "F16") else T[kind])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    file = GGUFFile(path)
    return {t.name: (file, t) for t in file.tensors}, raw


# max abs error of quantizing N(0, 1) values, a loose bound per type
QUANT_ERROR = {"F32": 0.0, "F16": 2e-3, "BF16": 2e-2, "Q8_0": 3e-2, "Q4_0": 0.5, "Q4_1": 0.4}


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"])
def test_tensor_type_dequantizes_like_the_reference(kind, typed_gguf):
    tensors, raw = typed_gguf
    data, source = raw[kind]
    got = dequantize_tensor(*tensors[kind])  # [rows, cols], torch fp32
    assert got.dtype == torch.float32 and tuple(got.shape) == (ROWS, COLS)
    if kind in ("F32", "F16"):
        expected = data.astype(np.float32)
    else:
        expected = dequantize_rows(data, kind, COLS)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6, atol=1e-6)
    if source is not None:
        assert np.abs(got.numpy() - source).max() <= QUANT_ERROR[kind]
    else:
        assert got.abs().max() > 0 and torch.isfinite(got).all()


def test_unsupported_tensor_type_is_a_clear_error(typed_gguf):
    tensors, _ = typed_gguf
    with pytest.raises(ModelLoadError, match="TQ1_0"):
        dequantize_tensor(*tensors["TQ1_0"])


def test_rope_row_permutations_are_inverses():
    w = torch.randn(4 * 16, 8)
    assert torch.equal(rope_rows_to_half_split(half_split_to_rope_rows(w, 4), 4), w)
    assert not torch.equal(half_split_to_rope_rows(w, 4), w)


# -- llama / qwen2 GGUFs written like llama.cpp's converter -------------------------------------

EXPORT_CASES = {
    "llama-gqa": (transformers.LlamaConfig, {}),
    "llama-tied": (transformers.LlamaConfig, {"tie_word_embeddings": True, "num_key_value_heads": 4}),
    "qwen2-bias": (transformers.Qwen2Config, {}),
}


@pytest.mark.parametrize("case", list(EXPORT_CASES))
@pytest.mark.parametrize("tensor_type", ["F32", "F16", "Q8_0"])
def test_exported_gguf_matches_transformers_and_original(case, tensor_type, tmp_path):
    """ours(GGUF) == transformers(GGUF) (same dequantized weights, llama Q/K permutation undone by both),
    and for F32 both == the original HF model. transformers' GGUF reader is an independent check of the
    llama.cpp conventions export_gguf writes (it reverses the Q/K permutation for llama, not for qwen2)."""
    config_class, overrides = EXPORT_CASES[case]
    original = tiny_hf_model(config_class, **overrides)
    original.save_pretrained(tmp_path)
    path = str(tmp_path / f"tiny-{tensor_type}.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, path, tensor_type)

    ids = list(range(5, 45))
    ours = torch.cat(our_logits_through_cache(load_ours(path), ids[:12], [[t] for t in ids[12:20]] + [ids[20:]]))
    theirs_model = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=os.path.basename(path), dtype=torch.float32
    ).eval()
    theirs = hf_logits(theirs_model, ids)
    assert (ours - theirs).abs().max() <= 1e-4
    reference = hf_logits(original, ids)
    bound = {"F32": 1e-4, "F16": 0.05, "Q8_0": 0.5}[tensor_type]  # quantization error on ~N(0, 3) logits
    assert (ours - reference).abs().max() <= bound
    if tensor_type == "F32":
        assert torch.equal(ours.argmax(-1), reference.argmax(-1))
    metadata = load_gguf(path).metadata["gguf_tensor_types"]
    assert metadata["model.layers.0.mlp.up_proj.weight"] == tensor_type
    assert metadata["model.layers.0.input_layernorm.weight"] == "F32"  # 1-D tensors stay F32, as llama.cpp


def test_exported_llama3_rope_scaling_round_trips(tmp_path):
    """llama3 rope scaling goes into llama.cpp's rope_freqs tensor; our loader applies it. (transformers 5's
    GGUF reader ignores rope_freqs, so it is not the reference here: the original HF model is.)"""
    rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    }
    original = tiny_hf_model(transformers.LlamaConfig, rope_scaling=rope)
    original.save_pretrained(tmp_path)
    path = str(tmp_path / "llama3.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, path, "F32")
    reloaded = load_gguf(path)
    assert reloaded.config.rope_scaling["rope_type"] == "freq_factors"
    again = str(tmp_path / "again.gguf")  # a GGUF-loaded checkpoint exports its rope_freqs unchanged
    export_gguf(reloaded, None, again, "F32")
    assert load_gguf(again).config.rope_scaling["factors"] == pytest.approx(reloaded.config.rope_scaling["factors"])
    ids = list(range(3, 80))
    ours = torch.cat(our_logits_through_cache(load_ours(path), ids, []))
    assert (ours - hf_logits(original, ids)).abs().max() <= 1e-4


def test_export_rejects_bad_tensor_type(tmp_path):
    original = tiny_hf_model(transformers.LlamaConfig)
    original.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="Q3_K"):
        export_gguf(load_checkpoint(str(tmp_path)), None, str(tmp_path / "x.gguf"), "Q3_K")
    assert gguf_name("model.layers.7.self_attn.o_proj.weight") == "blk.7.attn_output.weight"
    with pytest.raises(ValueError, match="vision"):
        gguf_name("vision.tower.weight")


def test_family_tensor_names_both_ways():
    """gemma3 renames llama's ffn_norm (its norm before the MLP) and adds norms; each family's names
    invert, and llama's table is unchanged by them."""
    assert hf_name("blk.2.ffn_norm.weight") == "model.layers.2.post_attention_layernorm.weight"
    assert hf_name("blk.2.ffn_norm.weight", "gemma3") == "model.layers.2.pre_feedforward_layernorm.weight"
    assert hf_name("blk.2.post_attention_norm.weight", "gemma3") == "model.layers.2.post_attention_layernorm.weight"
    assert hf_name("blk.2.attn_q_norm.weight", "qwen3") == "model.layers.2.self_attn.q_norm.weight"
    assert hf_name("blk.2.attn_q_norm.weight") is None
    for arch in ("llama", "qwen2", "qwen3", "gemma3"):
        for gg in layer_names(arch):
            assert gguf_name(hf_name(f"blk.5.{gg}", arch), arch) == f"blk.5.{gg}"
    with pytest.raises(ValueError):
        gguf_name("model.layers.0.post_feedforward_layernorm.weight")  # not a llama tensor


def test_export_with_tokenizer_round_trips(default_llm, tmp_path):
    """A GGUF written with the default model's tokenizer loads back (ours and transformers') with the
    same ids, pre-tokenizer, special tokens and chat template; and LLM() runs the file end to end."""
    from speclm import LLM
    from speclm.tokenizer import load_tokenizer
    from tests.test_tokenizer import TEXTS, WITH_SYSTEM

    source = default_llm.tokenizer
    original = tiny_hf_model(
        transformers.LlamaConfig,
        vocab_size=source.vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
    )
    original.save_pretrained(tmp_path)
    path = str(tmp_path / "with-tokenizer.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), source, path, "F16")
    assert field_value(open_gguf(path), "tokenizer.ggml.pre") == "smollm"
    ours = load_tokenizer(path)
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="with-tokenizer.gguf")
    for text in TEXTS:
        assert ours.encode(text) == source.encode(text) == theirs.encode(text, add_special_tokens=False)
    assert ours.apply_chat_template(WITH_SYSTEM) == source.apply_chat_template(WITH_SYSTEM)
    # <|endoftext|> ends generation too, named or not, as in llama.cpp
    assert (ours.bos_token_id, ours.eos_token_ids, ours.add_bos) == (1, [2, 0], False)
    assert ours.decode([0], skip_special_tokens=False) == "<|endoftext|>"
    out = LLM(path).generate("Hello", SamplingParams(max_tokens=5, ignore_eos=True))[0]
    assert len(out.token_ids) == 5


# -- the default model: SmolLM2-135M-Instruct Q4_1 vs transformers ------------------------------

PROMPTS = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]


@pytest.fixture(scope="module")
def hf_default():
    """transformers' load of the default GGUF (it dequantizes to fp32 as we do); loaded once."""
    path = default_model_path()
    directory, name = os.path.split(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    return model.eval()


def test_default_model_tensor_types():
    file = open_gguf(default_model_path())  # the loader's cached metadata
    kinds = {t.type_name for t in file.tensors}
    assert kinds == {"F32", "Q4_1", "Q8_0"}
    for kind in ("Q4_1", "Q8_0"):  # the real file's blocks decode like the reference decoder
        t = min((t for t in file.tensors if t.type_name == kind), key=lambda t: t.n_bytes)
        cols = t.shape[0]
        raw = np.frombuffer(file.read(t), dtype=np.uint8).reshape(t.rows, -1)
        expected = dequantize_rows(raw, kind, cols)
        np.testing.assert_allclose(dequantize_tensor(file, t).numpy().reshape(-1, cols), expected, rtol=1e-6, atol=1e-7)


def test_default_model_logits_match_transformers(default_fp32_llm, hf_default):
    tokenizer, model = default_fp32_llm.tokenizer, default_fp32_llm.model
    worst = 0.0
    for prompt in PROMPTS:
        ids = tokenizer.encode(prompt)
        ours = torch.cat(our_logits_through_cache(model, ids[:-2], [[ids[-2]], [ids[-1]]]))
        theirs = hf_logits(hf_default, ids)
        worst = max(worst, (ours - theirs).abs().max().item())
        assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    # Observed 4e-5 .. 6e-5 on logits of magnitude ~30 (fp32 summation order only).
    assert worst <= 5e-4, worst


def test_default_model_32_greedy_tokens_match_transformers(default_fp32_llm, hf_default):
    """Our 32 greedy tokens are transformers' greedy choice at every step (teacher-forced in one pass)."""
    params = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    out = default_fp32_llm.generate(PROMPTS[1], params)[0]
    ids = default_fp32_llm.tokenizer.encode(PROMPTS[1])
    assert len(out.token_ids) == 32
    theirs = hf_logits(hf_default, ids + out.token_ids)[len(ids) - 1 : -1]  # [32, vocab]
    assert theirs.argmax(-1).tolist() == out.token_ids
