"""Read Hugging Face model directories (config.json + safetensors) into a Checkpoint."""

from __future__ import annotations

import glob
import json
import os

import torch

import speclm.models.families as families
from speclm.models.checkpoint import Checkpoint, ModelLoadError
from speclm.models.config import ModelConfig


def load_hf_dir(path: str) -> Checkpoint:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise ModelLoadError(f"{path}: no config.json; not a Hugging Face model directory")
    with open(config_path) as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ModelLoadError(f"{config_path}: invalid JSON: {e}") from e
    try:
        config = ModelConfig.from_hf_dict(raw)
    except (KeyError, ValueError) as e:
        raise ModelLoadError(f"{config_path}: {e}") from e
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors files (pytorch_model.bin is not supported)")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            tensors.update(load_file(file))
        except (SafetensorError, OSError) as e:
            raise ModelLoadError(f"{file}: unreadable safetensors file: {e}") from e
    qconfig = raw.get("quantization_config")
    if qconfig:
        # Quantized speclm checkpoints become fp32 here; a runtime with int8/int4/fp8 linears would keep them packed.
        from speclm.models.qformat import dequantize_tensors

        tensors = dequantize_tensors(tensors, qconfig, path)
    tensors = {k: v.float() for k, v in tensors.items()}
    tensors = families.from_hf_tensors(config, tensors)  # (phi3's fused tensors split, gemma's norms 1 + weight)
    if config.tie_word_embeddings:
        tensors.pop("lm_head.weight", None)
    elif "lm_head.weight" not in tensors and "model.embed_tokens.weight" in tensors:
        config.tie_word_embeddings = True  # some exports omit the head when it equals the embedding
    return Checkpoint(config, tensors, source=path, metadata={"format": "hf", "hf_config": raw})
