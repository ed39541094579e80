"""ModelRunner: the only engine component that touches model tensors."""
from __future__ import annotations

import time

import torch

from speclm.kv.cache import KVCache
from speclm.kv.paged_cache import BatchEntry, PagedAttentionMetadata, PagedKVCache
from speclm.kv.quantized import int8_bytes_per_token
from speclm.models.layers import AttentionMetadata
from speclm.models.llama import LlamaModel
from speclm.spec.tree import TokenTree


class ModelRunner:
    """Runs the target model over new tokens of one sequence (or of a batch, through a paged cache)
    and returns their logits."""

    def __init__(self, model: LlamaModel) -> None:
        self.model = model
        model.use_lean_kernels()
        self.config = model.config

    @property
    def context_length(self) -> int:
        return self.config.max_position_embeddings

    def new_cache(self, capacity: int) -> KVCache:
        return self.model.new_cache(capacity)

    def _hidden(self, cache: KVCache, tokens: list[int], start: int, tree: TokenTree | None = None) -> torch.Tensor:
        n = len(tokens)
        if tree is None:
            positions, meta = torch.arange(start, start + n), AttentionMetadata(start, n)
        else:  # row r of a token tree sits at start + its depth and sees only its path
            positions = start + torch.tensor(tree.depths())
            meta = AttentionMetadata(start, n, paths=tree.row_paths())
        return self.model(torch.tensor(tokens, dtype=torch.long), positions, cache, meta)  # [n, hidden]

    def prefill(self, cache: KVCache, tokens: list[int]) -> float:
        """Fill the cache with `tokens` from slot 0 (no logits needed); returns seconds."""
        return self.prefill_features(cache, tokens)[1]

    def prefill_features(self, cache: KVCache, tokens: list[int]) -> tuple[torch.Tensor, float]:
        """prefill that also returns the tokens' features (hidden states after the final norm), [n, hidden]."""
        t0 = time.perf_counter()
        hidden = self._hidden(cache, tokens, 0)
        cache.truncate(len(tokens))
        return hidden, time.perf_counter() - t0

    def forward(self, cache: KVCache, tokens: list[int], start: int) -> tuple[torch.Tensor, float]:
        """Write `tokens` at cache slots start.. and return (logits [len(tokens), vocab], seconds).

        The cache's committed length is left for the caller to set: speculative callers keep only
        the accepted prefix.
        """
        logits, _, seconds = self.verify(cache, tokens, start)
        return logits, seconds

    def verify(
        self, cache: KVCache, tokens: list[int], start: int, tree: TokenTree | None = None, logits: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor, float]:
        """forward, also returning the features [len(tokens), hidden]. With `tree`, tokens are the
        pending token then the tree's nodes, written at slots start.. in that order (commit a path
        with KVCache.keep_slots). logits=False leaves them to `row_logits` (None returned)."""
        t0 = time.perf_counter()
        hidden = self._hidden(cache, tokens, start, tree)
        out = self.model.compute_logits(hidden) if logits else None
        return out, hidden, time.perf_counter() - t0

    def row_logits(self, hidden: torch.Tensor) -> "RowLogits":
        """Logits of single rows of `hidden` on demand (a tree walk needs only its path's rows)."""
        return RowLogits(self.model, hidden)


    def new_paged_cache(self, num_blocks: int, block_size: int, quantize: bool = False) -> PagedKVCache:
        c, device = self.config, self.model.embed_tokens.weight.device
        return PagedKVCache(c.num_layers, c.num_kv_heads, c.head_dim, num_blocks, block_size, self.model.attn_dtype,
                            device, quantize)

    def kv_bytes_per_token(self, quantize: bool = False) -> int:
        c = self.config
        if quantize:
            return int8_bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim)
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * self.model.attn_dtype.itemsize

    def forward_batch(self, cache: PagedKVCache, entries: list[BatchEntry]) -> tuple[torch.Tensor, torch.Tensor, float]:
        """One step over the new tokens of several sequences, flattened through the layers together.

        Returns (logits [sum of num_logits, vocab] in entry order, features [num_tokens, hidden]
        (hidden states after the final norm, for proposers that draft from them), seconds).
        """
        t0 = time.perf_counter()
        device = cache.keys.device
        tokens = torch.tensor([t for e in entries for t in e.tokens], dtype=torch.long, device=device)
        positions = torch.tensor([p for e in entries for p in e.positions()], device=device)
        rows, offset = [], 0
        for e in entries:
            offset += len(e.tokens)
            rows.extend(range(offset - e.num_logits, offset))
        hidden = self.model(tokens, positions, cache, PagedAttentionMetadata(entries, device))
        logits = self.model.compute_logits(hidden, rows) if rows else hidden.new_zeros(0, self.config.vocab_size)
        return logits, hidden, time.perf_counter() - t0


class RowLogits:
    """row -> fp32 logits [vocab], computed once per row with the one-row call plain decoding makes;
    `seconds` accumulates the time spent."""

    def __init__(self, model: LlamaModel, hidden: torch.Tensor) -> None:
        self.model, self.hidden = model, hidden
        self.rows: dict[int, torch.Tensor] = {}
        self.seconds = 0.0

    def __call__(self, row: int) -> torch.Tensor:
        if row not in self.rows:
            t0 = time.perf_counter()
            self.rows[row] = self.model.compute_logits(self.hidden, [row])[0]
            self.seconds += time.perf_counter() - t0
        return self.rows[row]
