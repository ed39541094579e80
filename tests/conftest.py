"""Shared fixtures: the real tiny stories260K model and the default SmolLM2 model."""

from __future__ import annotations

import os

import pytest

from speclm.data import SPECBENCH_PROMPTS

STORIES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "stories260K")  # see data/README.md
STORIES_MODEL = os.path.join(STORIES_DIR, "stories260K.bin")
STORIES_TOKENIZER = os.path.join(STORIES_DIR, "tok512.bin")
SPECBENCH = SPECBENCH_PROMPTS
STORIES_GOLDEN = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."


@pytest.fixture
def one_thread():
    """Run a test on one torch thread: on the tiny models the thread pool costs more than it gives
    (and far more when the 2 cores are shared). Opt in with pytest.mark.usefixtures("one_thread")."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def stories_llm():
    from speclm import LLM

    return LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER)


@pytest.fixture(scope="session")
def default_llm():
    """The default model in the default format (its GGUF file's own types)."""
    from speclm import LLM

    return LLM()


@pytest.fixture(scope="session")
def default_fp32_llm():
    """The default model with its weights dequantized to fp32 (conformance with transformers)."""
    from speclm import LLM

    return LLM(weights="fp32")


@pytest.fixture(scope="session")
def specbench_prompts() -> list[dict]:
    import json

    with open(SPECBENCH) as f:
        return [json.loads(line) for line in f]
