"""Write a checkpoint as a Hugging Face model directory: config.json, model.safetensors, tokenizer files."""

from __future__ import annotations

import json
import os

import torch

import speclm.models.families as families
from speclm.models.config import ModelConfig
from speclm.tokenizer import Tokenizer


def tokenizer_config(tokenizer: Tokenizer, max_length: int) -> dict:
    """tokenizer_config.json for PreTrainedTokenizerFast: special tokens, BOS rule and chat template."""

    def text(token_id: int | None) -> str | None:
        return None if token_id is None else tokenizer.backend.id_to_token(token_id)

    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text(tokenizer.bos_token_id),
        "eos_token": text(tokenizer.eos_token_ids[0]) if tokenizer.eos_token_ids else None,
        "add_bos_token": tokenizer.add_bos,
        "model_max_length": max_length,
    }
    if tokenizer.chat_template:
        cfg["chat_template"] = tokenizer.chat_template
    return {k: v for k, v in cfg.items() if v is not None}


def save_checkpoint(
    out_dir: str,
    config: ModelConfig,
    tensors: dict[str, torch.Tensor],
    tokenizer: Tokenizer,
    metadata: dict | None = None,
    quantization_config: dict | None = None,
) -> None:
    """Save `tensors` (HF names) with the config and tokenizer; `metadata` goes into the safetensors
    header (as JSON under "speclm"), `quantization_config` into config.json."""
    from safetensors.torch import save_file

    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f"--out {out_dir} exists and is not a directory")
    os.makedirs(out_dir, exist_ok=True)
    hf = config.to_hf_dict()
    if quantization_config:
        hf["quantization_config"] = quantization_config
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf, f, indent=2)
    if config.tie_word_embeddings:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    # as transformers reads them (phi3's fused tensors, gemma's norms)
    tensors = families.to_hf_tensors(config, tensors, fuse=not quantization_config)
    tensors = {k: v.detach().contiguous().clone() for k, v in tensors.items()}  # no shared storage (tied weights)
    header = {"format": "pt", "speclm": json.dumps(metadata or {})}
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata=header)
    tokenizer.backend.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(tokenizer_config(tokenizer, config.max_position_embeddings), f, indent=2)
    generation = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_ids}
    with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
        json.dump(generation, f, indent=2)
