"""qwen3 and gemma3 (speclm/models/families.py, variants.py) against transformers on tiny random checkpoints:
fp32 logits within 1e-4 through the KV cache, from safetensors and from GGUF, and 32 greedy tokens equal to
transformers' choices with and without speculation."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from speclm.compress.gguf_export import export_gguf
from speclm.models.builder import build_model
from speclm.models.checkpoint import ModelLoadError
from speclm.models.gguf_loader import load_gguf
from speclm.models.gguf_weights import native_kernels
from speclm.models.loader import load_checkpoint
from speclm.sampling_params import SamplingParams
from tests.models.hf_tiny import hf_logits, load_ours, our_logits_through_cache, tiny_hf_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

TOL = 1e-4
GEMMA3 = dict(
    head_dim=24,  # != hidden / heads
    sliding_window=8,  # the sequences below run past it
    query_pre_attn_scalar=20,
    num_hidden_layers=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
)
CASES = {
    "qwen3": ("Qwen3Config", {"head_dim": 24}),
    "qwen3-tied-mqa": ("Qwen3Config", {"head_dim": 32, "tie_word_embeddings": True, "num_key_value_heads": 1}),
    "gemma3": ("Gemma3TextConfig", GEMMA3),
    "gemma3-softcap": ("Gemma3TextConfig", GEMMA3 | {"final_logit_softcapping": 3.0, "tie_word_embeddings": False}),
}
# llama.cpp's gemma3: every 6th layer global, local rope base 10000, attention scale 1/sqrt(head_dim)
GEMMA3_GGUF = dict(head_dim=24, sliding_window=8, query_pre_attn_scalar=24, num_hidden_layers=6, hidden_size=48)


def _ids(vocab: int, n: int = 32) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(1)).tolist()


def _check(hf_model, ours) -> float:
    """Prefill 11 tokens, 16 decode steps, one 5-token chunk (a verification's shape): max abs logit diff."""
    ids = _ids(hf_model.config.vocab_size)
    expected = hf_logits(hf_model, ids)
    got = torch.cat(our_logits_through_cache(ours, ids[:11], [[t] for t in ids[11:27]] + [ids[27:]]))
    assert expected.abs().max() > 1.0
    diff = (got - expected).abs().max().item()
    assert diff <= TOL, f"max abs logit diff {diff}"
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    return diff


@pytest.mark.parametrize("case", list(CASES))
def test_safetensors_logits_match_transformers(case, tmp_path):
    class_name, overrides = CASES[case]
    hf_model = tiny_hf_model(getattr(transformers, class_name), **overrides)
    hf_model.save_pretrained(tmp_path)
    config = load_checkpoint(str(tmp_path)).config
    assert config.architecture == case.split("-")[0] and config.qk_norm
    _check(hf_model, load_ours(str(tmp_path)))


def _word_tokenizer(directory, vocab: int) -> None:
    """A tokenizer.json with one word per id, so LLM() runs a tiny checkpoint on token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(vocab)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.save(os.path.join(directory, "tokenizer.json"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({}, f)


def _greedy_follows_transformers(hf_model, model_path: str, tokenizer_dir: str, weights: str) -> None:
    """32 greedy tokens, plain and with n-gram speculation: the same, and transformers' argmax at every step."""
    from speclm import LLM

    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]  # repeats, so n-gram drafts something
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    llm = LLM(model_path, tokenizer=tokenizer_dir, weights=weights, threads=1)
    plain = llm.generate([prompt], params)[0].token_ids
    spec = llm.with_spec("ngram").generate([prompt], params)[0].token_ids
    assert spec == plain and len(plain) == 32
    logits = hf_logits(hf_model, prompt + plain)
    assert logits[len(prompt) - 1 : -1].argmax(-1).tolist() == plain


@pytest.mark.parametrize("case", ["qwen3", "gemma3"])
def test_greedy_with_and_without_speculation_follows_transformers(case, tmp_path):
    class_name, overrides = CASES[case]
    hf_model = tiny_hf_model(getattr(transformers, class_name), **overrides)
    hf_model.save_pretrained(tmp_path)
    _word_tokenizer(tmp_path, hf_model.config.vocab_size)
    _greedy_follows_transformers(hf_model, str(tmp_path), str(tmp_path), "fp32")


GGUF_CASES = {"qwen3": ("Qwen3Config", {"head_dim": 24}), "gemma3": ("Gemma3TextConfig", GEMMA3_GGUF)}


@pytest.mark.parametrize("case", list(GGUF_CASES))
def test_gguf_logits_match_transformers(case, tmp_path):
    """Exported as llama.cpp writes the family (q/k norms as attn_q_norm/attn_k_norm; gemma's norms as
    1 + weight and its post-norms under their own names), loaded back: F32 within 1e-4 of the original;
    F16 and Q8_0 within their quantization error, dequantized and on their own grids (--weights auto)."""
    class_name, overrides = GGUF_CASES[case]
    hf_model = tiny_hf_model(getattr(transformers, class_name), **overrides)
    hf_model.save_pretrained(tmp_path)
    names = {}
    for tensor_type in ("F32", "F16", "Q8_0"):
        path = str(tmp_path / f"{case}-{tensor_type}.gguf")
        export_gguf(load_checkpoint(str(tmp_path)), None, path, tensor_type)
        names[tensor_type] = path
    checkpoint = load_gguf(names["F32"])
    assert checkpoint.config.architecture == case and checkpoint.config.qk_norm
    assert "model.layers.0.self_attn.q_norm.weight" in checkpoint.tensors
    if case == "gemma3":
        assert checkpoint.config.layer_types[5] == "full_attention" and checkpoint.config.sliding_window == 8
        assert "blk.0.post_ffw_norm.weight" in {t.name for t in checkpoint.tensors.file.tensors}
    _check(hf_model, load_ours(names["F32"]))
    ids = _ids(hf_model.config.vocab_size)
    reference = hf_logits(hf_model, ids)
    for tensor_type, bound in (("F16", 0.2), ("Q8_0", 1.0)):  # on ~N(0, 3) logits
        dequantized = torch.cat(our_logits_through_cache(load_ours(names[tensor_type]), ids, []))
        assert (dequantized - reference).abs().max() <= bound
        native = build_model(load_checkpoint(names[tensor_type]), weights="auto")
        got = torch.cat(our_logits_through_cache(native, ids, []))
        assert (got - reference).abs().max() <= 1.0  # int8 activations too (llama.cpp's scheme), 6 layers


def test_variant_layers_declare_they_do_not_run_in_the_native_decoder(tmp_path):
    """qwen3's q/k norms are not in the C++ decoder: its layers say so, and the Python layers run them."""
    from speclm.models.native_decoder import native_decoder

    hf_model = tiny_hf_model(transformers.Qwen3Config, head_dim=32)
    hf_model.save_pretrained(tmp_path)
    path = str(tmp_path / "q8.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, path, "Q8_0")
    model = build_model(load_checkpoint(path), weights="auto")
    assert all(layer.native is False for layer in model.layers)
    assert native_decoder(model.layers) is None


def test_gguf_greedy_with_and_without_speculation(tmp_path):
    """The GGUF-native gemma3 (Q8_0, --weights auto) on the engine: n-gram speculation is exact; F32 follows
    transformers."""
    hf_model = tiny_hf_model(transformers.Gemma3TextConfig, **GEMMA3_GGUF)
    hf_model.save_pretrained(tmp_path)
    _word_tokenizer(tmp_path, hf_model.config.vocab_size)
    path = str(tmp_path / "g.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, path, "F32")
    _greedy_follows_transformers(hf_model, path, str(tmp_path), "auto")


def test_unsupported_architecture_is_one_line_before_weights(tmp_path):
    path = str(tmp_path / "phi2.gguf")
    writer = gguf.GGUFWriter(path, "phi2")
    writer.add_block_count(1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(
        ModelLoadError, match=r"unsupported GGUF architecture 'phi2' \(supported: .*qwen3, gemma3, phi3\)"
    ):
        load_checkpoint(path)
    (tmp_path / "hf").mkdir()
    with open(tmp_path / "hf" / "config.json", "w") as f:
        json.dump({"architectures": ["PhiForCausalLM"], "model_type": "phi"}, f)
    with pytest.raises(ModelLoadError, match="Qwen3ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM"):
        load_checkpoint(str(tmp_path / "hf"))


def test_unsupported_tensor_type_is_one_line_before_weights(tmp_path, monkeypatch):
    """A tensor type we do not run (Q2_K here) is named with the types we do, from the tensor table alone
    (reading any tensor's data fails this test)."""
    hf_model = tiny_hf_model(transformers.Qwen3Config, head_dim=32)
    hf_model.save_pretrained(tmp_path)
    path = str(tmp_path / "q2k.gguf")
    export_gguf(load_checkpoint(str(tmp_path)), None, path, "F32")
    reader = gguf.GGUFReader(path)
    writer = gguf.GGUFWriter(str(tmp_path / "bad.gguf"), "qwen3")
    config = load_checkpoint(path).config
    for key, value in (("block_count", 2), ("embedding_length", 64), ("feed_forward_length", 96)):
        getattr(writer, f"add_{key}")(value)
    writer.add_head_count(config.num_heads)
    writer.add_head_count_kv(config.num_kv_heads)
    writer.add_key_length(32)
    writer.add_value_length(32)
    writer.add_vocab_size(config.vocab_size)
    kind = gguf.GGMLQuantizationType.Q2_K
    for t in reader.tensors:
        shape = [int(x) for x in reversed(t.shape)]
        if t.name == "blk.1.ffn_down.weight":  # 96 inputs do not fill a 256-wide Q2_K block: say 1 x 256 values
            writer.add_tensor(t.name, np.zeros((1, 84), np.uint8), raw_dtype=kind)
        else:
            writer.add_tensor(t.name, np.zeros(shape, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    from speclm.models.gguf_file import GGUFFile

    def no_reads(*args, **kwargs):
        raise AssertionError("a tensor was read")

    monkeypatch.setattr(GGUFFile, "read", no_reads)
    with pytest.raises(ModelLoadError, match=r"blk.1.ffn_down.weight has GGUF type Q2_K \(supported: F32, .*Q6_K"):
        load_checkpoint(str(tmp_path / "bad.gguf"))


def test_llama3_rope_freqs_on_the_gguf_native_path(tmp_path):
    """llama 3.x rope scaling as llama.cpp stores it (the rope_freqs tensor) on a Q8_0 file's own grids
    (--weights auto, the C++ decoder): the file's fp32 load within 1e-4 of transformers (F32), the native
    one within Q8_0's error, over positions past the original context where the scaling matters."""
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    original = tiny_hf_model(transformers.LlamaConfig, rope_scaling=rope | {"original_max_position_embeddings": 32})
    original.save_pretrained(tmp_path)
    ids = _ids(original.config.vocab_size, 80)
    reference = hf_logits(original, ids)
    for tensor_type, bound in (("F32", TOL), ("Q8_0", 0.5)):
        path = str(tmp_path / f"llama3-{tensor_type}.gguf")
        export_gguf(load_checkpoint(str(tmp_path)), None, path, tensor_type)
        assert load_gguf(path).config.rope_scaling["rope_type"] == "freq_factors"
        model = build_model(load_checkpoint(path), weights="auto")
        model.use_lean_ops()
        if native_kernels() is not None:  # (AVX-512 VNNI or AVX2)
            assert (model.native_decoder is not None) == (tensor_type == "Q8_0")
        got = torch.cat(our_logits_through_cache(model, ids[:40], [[t] for t in ids[40:44]] + [ids[44:]]))
        assert (got - reference).abs().max() <= bound


@pytest.mark.parametrize("case", ["gemma3", "qwen3"])
@pytest.mark.parametrize("source", ["checkpoint", "model"])
def test_save_then_reload_gives_equal_logits(case, source, tmp_path):
    """speclm's save path (quantize, prune, distill and merge write through it) stores a family as transformers
    does: gemma's norms as the weight its (1 + weight) adds 1 to, the q/k norms (gemma3's q norm without the
    attention scale the builder folds into it). Reloaded, the logits are the original's, in speclm and in
    transformers; from the checkpoint's tensors or from a built model's (model_to_tensors)."""
    from speclm.compress.model_io import load_with_tokenizer, model_to_tensors, rebuild
    from speclm.compress.save import save_checkpoint

    class_name, overrides = CASES[case]
    hf_model = tiny_hf_model(getattr(transformers, class_name), **overrides)
    hf_model.save_pretrained(tmp_path / "src")
    _word_tokenizer(tmp_path / "src", hf_model.config.vocab_size)
    checkpoint, tokenizer = load_with_tokenizer(str(tmp_path / "src"))
    tensors = dict(checkpoint.tensors) if source == "checkpoint" else model_to_tensors(rebuild(checkpoint))
    save_checkpoint(str(tmp_path / "out"), checkpoint.config, tensors, tokenizer)
    ids = _ids(hf_model.config.vocab_size)
    before = torch.cat(our_logits_through_cache(load_ours(str(tmp_path / "src")), ids, []))
    after = torch.cat(our_logits_through_cache(load_ours(str(tmp_path / "out")), ids, []))
    assert (after - before).abs().max() <= TOL  # (1 + weight - 1 rounds in fp32)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"), attn_implementation="eager")
    assert (hf_logits(reloaded, ids) - hf_logits(hf_model, ids)).abs().max() <= TOL
