"""Outputs load where they claim to: float checkpoints in transformers and speclm, quantized ones in speclm."""

import json

import pytest
import torch

from speclm.cli import main
from speclm.compress.model_io import load_with_tokenizer, model_to_tensors, rebuild
from speclm.compress.quantize import QuantizeOptions, quantize_model
from speclm.compress.save import save_checkpoint
from speclm.models.attention import AttentionMetadata
from speclm.models.loader import load_checkpoint
from tests.compress.conftest import CALIBRATION, stories_command
from tests.conftest import SPECBENCH, STORIES_MODEL, STORIES_TOKENIZER

PROMPT_IDS = [1, 403, 407, 261, 378, 432, 383, 300, 290]


def logits_of(model, ids):
    n = len(ids)
    hidden = model(torch.tensor(ids), torch.arange(n), model.new_cache(n), AttentionMetadata(0, n))
    return model.compute_logits(hidden)


@pytest.fixture(scope="module")
def stories():
    return load_with_tokenizer(STORIES_MODEL, STORIES_TOKENIZER)


@pytest.fixture(scope="module")
def saved_fp32(stories, tmp_path_factory):
    checkpoint, tokenizer = stories
    out = tmp_path_factory.mktemp("fp32")
    save_checkpoint(str(out), checkpoint.config, model_to_tensors(rebuild(checkpoint)), tokenizer, {"note": "test"})
    return out


def test_model_to_tensors_inverts_build_model(stories):
    checkpoint, _ = stories
    tensors = model_to_tensors(rebuild(checkpoint))
    assert tensors.keys() == checkpoint.tensors.keys()
    for name, t in checkpoint.tensors.items():
        assert torch.equal(tensors[name], t), name


def test_float_checkpoint_loads_in_speclm_with_identical_logits(stories, saved_fp32):
    checkpoint, tokenizer = stories
    reloaded, reloaded_tokenizer = load_with_tokenizer(str(saved_fp32))
    assert torch.equal(logits_of(rebuild(reloaded), PROMPT_IDS), logits_of(rebuild(checkpoint), PROMPT_IDS))
    text = "Once upon a time, Lily saw a big dog."
    assert reloaded_tokenizer.encode(text) == tokenizer.encode(text)


def test_float_checkpoint_loads_in_transformers(stories, saved_fp32):
    transformers = pytest.importorskip("transformers")
    checkpoint, tokenizer = stories
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(saved_fp32), dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = hf(torch.tensor([PROMPT_IDS])).logits[0]
    torch.testing.assert_close(hf_logits, logits_of(rebuild(checkpoint), PROMPT_IDS), rtol=1e-4, atol=1e-4)
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(saved_fp32))
    text = "The little cat jumped over the moon."
    assert hf_tok(text, add_special_tokens=False)["input_ids"] == tokenizer.encode(text, add_bos=False)


@pytest.mark.parametrize("method,max_rel", [("rtn-int4", 0.2), ("rtn-int8", 0.01), ("fp8-e4m3", 0.06)])
def test_quantized_checkpoint_records_its_scheme_and_loads_dequantized(stories, tmp_path, method, max_rel):
    from safetensors import safe_open

    checkpoint, tokenizer = stories
    result = quantize_model(rebuild(checkpoint), QuantizeOptions(method))
    save_checkpoint(
        str(tmp_path),
        checkpoint.config,
        result.tensors,
        tokenizer,
        {"quantization": result.quantization_config},
        result.quantization_config,
    )
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config["method"] == method and config["quant_method"] == "speclm"
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["speclm"])["quantization"]["method"] == method
        stored = {k: f.get_tensor(k) for k in f.keys()}
    name = "model.layers.0.self_attn.q_proj"
    if method.startswith("rtn"):
        assert stored[name + ".qweight"].dtype == torch.uint8 and name + ".weight" not in stored
        assert config["bits"] == int(method[-1]) and config["group_size"] == (0 if method == "rtn-int8" else 128)
    else:
        assert stored[name + ".weight"].dtype == torch.float8_e4m3fn
    reloaded = load_checkpoint(str(tmp_path))
    expected = model_to_tensors(result.model)
    for key, value in expected.items():  # dequantized on load == the fake-quantized model's weights
        torch.testing.assert_close(reloaded.tensors[key], value, rtol=1e-6, atol=1e-6)
    w, wq = checkpoint.tensors[name + ".weight"], reloaded.tensors[name + ".weight"]
    assert 0 < (w - wq).norm() / w.norm() < max_rel


def test_eval_ppl_json_and_quantize_cli_with_calibration(tmp_path, capsys):
    text = ["--text", SPECBENCH, "--categories", "summarization", "--seq-len", "128", "--max-windows", "3", "--json"]
    assert stories_command("eval ppl", *text) == 0
    base = json.loads(capsys.readouterr().out)
    assert base["windows"] == 3 and base["tokens"] == 3 * 127 and base["seq_len"] == 128
    assert 5 < base["perplexity"] < 500
    out = str(tmp_path / "gptq")
    assert stories_command("quantize", "--method", "gptq-int4", "--out", out, *CALIBRATION, "--seed", "1") == 0
    capsys.readouterr()
    assert main(["eval", "ppl", "--model", out, *text]) == 0
    quantized = json.loads(capsys.readouterr().out)
    assert base["perplexity"] < quantized["perplexity"] < 1.5 * base["perplexity"]
    with open(f"{out}/config.json") as f:  # act-order is GPTQ's default (--no-act-order turns it off)
        assert json.load(f)["quantization_config"]["act_order"] is True


def test_user_mistakes_are_one_line_errors(capsys):
    assert stories_command("quantize", "--method", "gptq-int4", "--out", "/tmp/never") == 2
    assert "needs calibration text" in capsys.readouterr().err
    assert stories_command("eval ppl", "--text", SPECBENCH, "--categories", "nonexistent") == 2
    assert "no text selected" in capsys.readouterr().err


def test_compressing_a_rebuilt_model_leaves_the_checkpoint_untouched(stories):
    checkpoint, _ = stories
    before = {k: v.clone() for k, v in checkpoint.tensors.items()}
    quantize_model(rebuild(checkpoint), QuantizeOptions("rtn-int4"))
    for name, t in before.items():
        assert torch.equal(checkpoint.tensors[name], t), name
