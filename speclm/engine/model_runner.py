"""ModelRunner: the only engine component that touches model tensors."""
from __future__ import annotations

import time

import torch

from speclm.kv.cache import KVCache
from speclm.models.layers import AttentionMetadata
from speclm.models.llama import LlamaModel


class ModelRunner:
    """Runs the target model over new tokens of one sequence and returns their logits."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        self.config = model.config

    @property
    def context_length(self) -> int:
        return self.config.max_position_embeddings

    def new_cache(self, capacity: int) -> KVCache:
        return self.model.new_cache(capacity)

    def forward(self, cache: KVCache, tokens: list[int], start: int, logits_from: int = 0) -> tuple[torch.Tensor, float]:
        """Write `tokens` at cache slots start.. and return (logits [len(tokens) - logits_from, vocab], seconds).

        The cache's committed length is left for the caller to set: speculative callers keep only
        the accepted prefix.
        """
        t0 = time.perf_counter()
        n = len(tokens)
        hidden = self.model(
            torch.tensor(tokens, dtype=torch.long),
            torch.arange(start, start + n),
            cache,
            AttentionMetadata(start, n),
        )
        logits = self.model.compute_logits(hidden[logits_from:])
        return logits, time.perf_counter() - t0
