"""GPU test fixtures: stories260K on the GPU (fp32 and the default half precision) and on the CPU."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

# SPECLM_GPU_TESTS_DEVICE=cpu runs these tests' code on the CPU (a dry run of the test code itself, where the
# GPU-only assertions fail by design); by default they need a CUDA GPU and skip without one.
DEVICE = os.environ.get("SPECLM_GPU_TESTS_DEVICE", "cuda")
needs_cuda = [
    pytest.mark.cuda,
    pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
PROMPTS = ["Once upon a time", "Tom had a red ball. Tom had a red ball. Tom", "The cat sat on the", ""]


@pytest.fixture(scope="session")
def stories_cpu():
    from speclm import LLM

    return LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, device="cpu")


@pytest.fixture(scope="session")
def stories_gpu_fp32():
    from speclm import LLM

    return LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, device=DEVICE, weights="fp32")


@pytest.fixture(scope="session")
def stories_gpu():
    """The default GPU format: bf16 (fp16 where bf16 is missing)."""
    from speclm import LLM

    return LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, device=DEVICE)


@pytest.fixture(scope="session")
def perturbed_gpu_dir(tmp_path_factory) -> str:
    """stories260K with noise on every weight: a draft that often disagrees (tests/speculative/conftest.py's)."""
    from tests.speculative.conftest import write_perturbed_stories

    return write_perturbed_stories(str(tmp_path_factory.mktemp("perturbed_stories_gpu")))
