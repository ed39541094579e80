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

    `parents` makes the drafts a tree (verified in one pass, see speclm/spec/tree.py): parents[i] is
    the index of node i's parent draft, -1 for a child of the pending token; parents come before
    their children. None is a chain (parents = [-1, 0, 1, ...]). In a tree, probs[i] is the draft
    distribution node i was drawn from (siblings drawn independently from their parent's q).
    """

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None  # [K, vocab]
    parents: list[int] | None = None  # [K]


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


class FeatureProposer(Proposer, Protocol):
    """A proposer that drafts from the target's hidden states (Medusa, EAGLE). The engine sets
    `wants_features` proposers apart and hands them the features of every committed position but
    the pending last one: after prefill those of prompt[:-1], after each verification those of the
    rows whose next token was committed. So with L committed tokens it holds f_0 .. f_{L-2}.

    `feature_history` (default True) says the proposer needs all of them; False (Medusa drafts from
    the last one only) lets the batched engine reuse prefix-cache blocks, whose positions it never
    computes and so has no features for."""

    wants_features: bool

    def add_features(self, features: torch.Tensor) -> None:  # [n, hidden], next committed positions
        """Append the target's features of the next n committed positions."""


def wants_features(proposer: Proposer | None) -> bool:
    """True when the engine must keep hidden states for this proposer (others cost nothing extra)."""
    return bool(getattr(proposer, "wants_features", False))


def wants_feature_history(proposer: Proposer | None) -> bool:
    """True when the proposer needs the features of every committed position, not just the latest."""
    return wants_features(proposer) and bool(getattr(proposer, "feature_history", True))
