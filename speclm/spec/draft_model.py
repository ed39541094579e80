"""Draft-model proposers: a separate small model (draft:PATH) or the target's first N layers (layerskip:N)."""
from __future__ import annotations

import torch

from speclm.models.layers import AttentionMetadata
from speclm.models.llama import LlamaModel
from speclm.sample.sampler import processed_probs, sample_from_probs
from speclm.sampling_params import SamplingParams
from speclm.spec.proposer import Proposal


class DraftModelProposer:
    """Runs a cheaper model autoregressively for k steps with its own KV cache.

    The cache stays in sync by construction: before each proposal the proposer keeps the longest
    prefix of what it has cached that still agrees with the committed context, and feeds the rest.
    So rejected drafts are rolled back without the engine telling it which ones.
    """

    def __init__(self, model: LlamaModel, num_layers: int | None = None, name: str = "draft") -> None:
        self.model = model
        self.num_layers = num_layers
        self.name = name
        self.cache = None
        self.cached_ids: list[int] = []

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.cache = self.model.new_cache(capacity, self.num_layers)
        self.cached_ids = []

    def _feed(self, tokens: list[int]) -> torch.Tensor:
        """Run `tokens` after the cached ones; logits of the last, [1, vocab]."""
        start = self.cache.length
        hidden = self.model(
            torch.tensor(tokens),
            torch.arange(start, start + len(tokens)),
            self.cache,
            AttentionMetadata(start, len(tokens)),
            num_layers=self.num_layers,
        )
        self.cache.truncate(start + len(tokens))
        self.cached_ids.extend(tokens)
        return self.model.compute_logits(hidden, [-1])

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None) -> Proposal:
        keep = 0
        limit = min(len(self.cached_ids), len(context) - 1)  # always re-feed the last token for its logits
        while keep < limit and self.cached_ids[keep] == context[keep]:
            keep += 1
        self.cache.truncate(keep)
        del self.cached_ids[keep:]
        logits = self._feed(context[keep:])
        tokens: list[int] = []
        probs: list[torch.Tensor] = []
        for i in range(k):
            if params.greedy:
                token = int(logits.argmax(-1))
            else:
                q = processed_probs(logits, params)  # [1, vocab]
                token = int(sample_from_probs(q, generator))
                probs.append(q[0])
            tokens.append(token)
            if i + 1 < k:
                logits = self._feed([token])
        return Proposal(tokens, torch.stack(probs) if probs else None)

    def update(self, num_accepted: int) -> None:
        pass  # the next propose() re-syncs the cache against the committed context
