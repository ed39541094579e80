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

    def _hidden(self, cache: KVCache, tokens: list[int], start: int) -> torch.Tensor:
        n = len(tokens)
        return self.model(
            torch.tensor(tokens, dtype=torch.long), torch.arange(start, start + n), cache, AttentionMetadata(start, n)
        )  # [n, hidden]

    def prefill(self, cache: KVCache, tokens: list[int]) -> float:
        """Fill the cache with `tokens` from slot 0 (no logits needed); returns seconds."""
        t0 = time.perf_counter()
        self._hidden(cache, tokens, 0)
        cache.truncate(len(tokens))
        return time.perf_counter() - t0

    def forward(self, cache: KVCache, tokens: list[int], start: int) -> tuple[torch.Tensor, float]:
        """Write `tokens` at cache slots start.. and return (logits [len(tokens), vocab], seconds).

        The cache's committed length is left for the caller to set: speculative callers keep only
        the accepted prefix.
        """
        t0 = time.perf_counter()
        logits = self.model.compute_logits(self._hidden(cache, tokens, start))
        return logits, time.perf_counter() - t0
