"""--device and LLM(device=...): auto takes a GPU only when torch sees one; `cuda` without one is one clear error."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from speclm.models.device import resolve_device
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def test_auto_and_cpu():
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert resolve_device(None).type == expected


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cuda:-1", "tpu", ""])
def test_malformed_devices_are_refused(value):
    with pytest.raises(ValueError, match="device"):
        resolve_device(value)


@no_cuda
@pytest.mark.parametrize("value", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_a_gpu_is_a_value_error(value):
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device(value)


@no_cuda
def test_llm_refuses_cuda_before_loading():
    from speclm import LLM

    with pytest.raises(ValueError, match="no CUDA GPU"):
        LLM("no/such/model/anywhere.gguf", device="cuda")


@no_cuda
def test_cli_device_cuda_without_a_gpu_is_one_error_line():
    cmd = [sys.executable, "-m", "speclm", "generate", "--device", "cuda", "--prompt", "x"]
    cmd += ["--model", STORIES_MODEL, "--tokenizer", STORIES_TOKENIZER]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "cuda" in lines[0], proc.stderr


def test_deploy_and_distill_refuse_a_gpu_they_would_ignore():
    import argparse

    from speclm.cli.common import refuse_gpu

    refuse_gpu(argparse.Namespace(device="auto"), "deploy")
    refuse_gpu(argparse.Namespace(device="cpu"), "deploy")
    with pytest.raises(ValueError, match="CPU only"):
        refuse_gpu(argparse.Namespace(device="cuda:0"), "distill")


def test_gpu_options_from_the_command_line_and_their_stage_line_words():
    import argparse

    from speclm.cli.common import add_model_args, gpu_options

    parser = argparse.ArgumentParser()
    add_model_args(parser)
    defaults = parser.parse_args([])
    off = parser.parse_args(["--no-cuda-graphs", "--no-batch-invariant"])
    assert gpu_options(defaults, torch.device("cpu")) == ({"cuda_graphs": True, "batch_invariant": True}, "")
    options, words = gpu_options(off, torch.device("cuda", 0))
    assert options == {"cuda_graphs": False, "batch_invariant": False}
    assert words == ", cuda graphs off, batch invariant off"
    assert gpu_options(defaults, torch.device("cuda", 0))[1] == ", cuda graphs on, batch invariant on"


def test_column_major_weights_keep_every_linears_values_and_the_tied_head():
    """A GPU model's linear weights are stored transposed (cuBLAS's faster kernels for decoding's few rows):
    the same values and products, the tied head still the embedding table."""
    from speclm.models.config import ModelConfig
    from speclm.models.device import column_major_weights
    from speclm.models.llama import LlamaModel

    torch.manual_seed(0)
    config = ModelConfig("llama", 64, 16, 32, num_layers=2, num_heads=4, num_kv_heads=2, tie_word_embeddings=True)
    model = LlamaModel(config)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    before = [m.weight.detach().clone() for m in linears]
    x = torch.randn(3, 32)
    products = [torch.nn.functional.linear(x[:, : m.in_features], m.weight) for m in linears]
    column_major_weights(model)
    for m, w, y in zip(linears, before, products):
        assert torch.equal(m.weight, w) and m.weight.stride() == (1, m.out_features)
        torch.testing.assert_close(torch.nn.functional.linear(x[:, : m.in_features], m.weight), y)
    assert model.lm_head.weight is model.embed_tokens.weight
    assert torch.equal(model.embed_tokens(torch.tensor([3, 5])), before[-1][[3, 5]])
