"""Perplexity over non-overlapping windows: exp of the mean next-token NLL (GPTQ/SparseGPT convention)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from speclm.models.attention import AttentionMetadata
from speclm.models.llama import LlamaModel


@dataclass
class PerplexityResult:
    """perplexity = exp(total NLL / tokens); `tokens` counts predicted tokens (seq_len - 1 per window)."""

    perplexity: float
    tokens: int
    windows: int
    seq_len: int
    window_nll: list[float] = field(default_factory=list)  # summed NLL of each window (for paired comparisons)

    def to_dict(self) -> dict:
        return {"perplexity": self.perplexity, "tokens": self.tokens, "windows": self.windows, "seq_len": self.seq_len}


@torch.inference_mode()
def window_nll(model: LlamaModel, window: torch.Tensor) -> torch.Tensor:
    """Summed NLL (fp64 scalar) of tokens 1..L-1 of one window, run from an empty cache."""
    n = window.numel()
    cache = model.new_cache(n)
    hidden = model(window, torch.arange(n), cache, AttentionMetadata(0, n))  # [n, hidden]
    logits = model.compute_logits(hidden[:-1])  # [n-1, vocab]
    return F.cross_entropy(logits, window[1:], reduction="sum").double()


def perplexity(model: LlamaModel, windows: torch.Tensor, progress: bool = True) -> PerplexityResult:
    """Perplexity of `model` over windows [num_windows, seq_len], each evaluated independently."""
    nll = [window_nll(model, w).item() for w in tqdm(windows, desc="perplexity", unit="window", disable=not progress)]
    num_windows, seq_len = windows.shape
    tokens = num_windows * (seq_len - 1)
    return PerplexityResult(math.exp(math.fsum(nll) / tokens), tokens, num_windows, seq_len, nll)
