"""Shared fixtures: the real tiny stories260K model and the default SmolLM2 model."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

from speclm.data import SPECBENCH_PROMPTS

STORIES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "stories260K")  # see data/README.md
STORIES_MODEL = os.path.join(STORIES_DIR, "stories260K.bin")
STORIES_TOKENIZER = os.path.join(STORIES_DIR, "tok512.bin")
SPECBENCH = SPECBENCH_PROMPTS
STORIES_GOLDEN = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."

# Packed-weights cache entries (speclm/models/pack_cache.py) go to a folder of this session's, not the
# user's ~/.cache; the processes the tests start inherit it. Removed when the session ends.
PACK_CACHE = os.environ.setdefault("SPECLM_PACK_CACHE", tempfile.mkdtemp(prefix="speclm-pack-cache-"))


def pytest_sessionfinish(session, exitstatus):
    if os.path.basename(PACK_CACHE).startswith("speclm-pack-cache-"):
        shutil.rmtree(PACK_CACHE, ignore_errors=True)


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
