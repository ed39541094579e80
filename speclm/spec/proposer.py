"""The proposer protocol: guess the next K tokens cheaply; the target verifies them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from speclm.sampling_params import SamplingParams


@dataclass
class Proposal:
    """Draft tokens and, for sampled drafts, the processed draft distribution they came from.

    `probs` is None for deterministic proposers (n-gram, greedy drafts): the verifier then treats the
    draft distribution as one-hot on each token, which keeps sampling exact.
    """

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None  # [K, vocab]


class Proposer(Protocol):
    """What the speculative loop needs from a proposer."""

    name: str

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        """Reset per-request state for a new prompt; `capacity` bounds the sequence length."""

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """Up to k tokens likely to follow `context` (all committed tokens so far)."""

    def update(self, num_accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""
