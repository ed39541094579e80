"""Text for evaluation and calibration: plain files or Spec-Bench JSONL, tokenized into windows."""

from __future__ import annotations

import json
import os

import torch

from speclm.tokenizer import Tokenizer


def read_texts(path: str, categories: list[str] | None = None, exclude: list[str] | None = None) -> list[str]:
    """The documents in `path`: a .jsonl Spec-Bench file gives every turn of the rows whose category
    is in `categories` (all if None) and not in `exclude`; any other file is one document."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"text file not found: {path}")
    if not path.endswith(".jsonl"):
        if categories or exclude:
            raise ValueError(f"--categories/--exclude-categories need a Spec-Bench .jsonl file, got {path}")
        with open(path, encoding="utf-8") as f:
            return [f.read()]
    texts = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                category, turns = row["category"], row["turns"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_no}: not a Spec-Bench line ({e})") from e
            if (categories and category not in categories) or (exclude and category in exclude):
                continue
            texts.extend(t for t in turns if t)
    if not texts:
        raise ValueError(f"{path}: no text selected (categories={categories}, exclude={exclude})")
    return texts


def tokenize_stream(tokenizer: Tokenizer, texts: list[str]) -> torch.Tensor:
    """All documents tokenized once as one stream (joined by blank lines, no BOS): [num_tokens]."""
    ids = tokenizer.encode("\n\n".join(texts), add_bos=False)
    return torch.tensor(ids, dtype=torch.long)


def eval_windows(stream: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Non-overlapping windows [num_windows, seq_len]; the remainder is dropped (GPTQ convention)."""
    if seq_len < 2:
        raise ValueError(f"--seq-len must be at least 2, got {seq_len}")
    n = stream.numel() // seq_len
    if n == 0:
        raise ValueError(f"the text has {stream.numel()} tokens, fewer than one window of --seq-len {seq_len}")
    return stream[: n * seq_len].view(n, seq_len)


def calibration_windows(stream: torch.Tensor, num_samples: int, seq_len: int, seed: int) -> torch.Tensor:
    """`num_samples` windows [num_samples, seq_len] at random offsets of the stream (seeded), as GPTQ samples C4."""
    if num_samples < 1:
        raise ValueError(f"--calib-samples must be positive, got {num_samples}")
    if stream.numel() <= seq_len:
        raise ValueError(f"calibration text has {stream.numel()} tokens; need more than --calib-seq-len {seq_len}")
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - seq_len, (num_samples,), generator=generator)
    return torch.stack([stream[s : s + seq_len] for s in starts.tolist()])
