"""The proposer interface: guess the next K tokens cheaply; the target verifies them.

A proposer declares what it can do on the class (`proposes_trees`, `wants_features`,
`feature_history`); the engine reads those declarations, never probes for methods.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from speclm.sample.tree import TokenTree
from speclm.sampling_params import SamplingParams


@dataclass
class Proposal:
    """Draft tokens and, for sampled drafts, the processed draft distribution they came from.

    `probs` is None for deterministic proposers (n-gram, greedy drafts): the verifier then treats the
    draft distribution as one-hot on each token, which keeps sampling exact.

    `parents` makes the drafts a tree (verified in one pass, see speclm/sample/tree.py): parents[i] is
    the index of node i's parent draft, -1 for a child of the pending token; parents come before
    their children. None is a chain (parents = [-1, 0, 1, ...]). In a tree, probs[i] is the draft
    distribution node i was drawn from (siblings drawn independently from their parent's q).
    """

    tokens: list[int] = field(default_factory=list)
    probs: torch.Tensor | None = None  # [K, vocab]
    parents: list[int] | None = None  # [K]
    # observes_rows proposers: the nodes (a chain, in order) whose rows' greedy tokens observe_rows gets.
    observed: list[int] = field(default_factory=list)

    def tree(self, k: int | None = None) -> TokenTree:
        """The shape of the first k drafts (all by default); parents come first, so any prefix is a tree."""
        k = len(self.tokens) if k is None else k
        return TokenTree.chain(k) if self.parents is None else TokenTree(tuple(self.parents[:k]))

    def limited_to_depth(self, max_depth: int) -> Proposal:
        """The proposal without its nodes deeper than max_depth (their ancestors are shallower, so the
        rest is still a tree in parents-first order)."""
        if self.parents is None:
            observed = [i for i in self.observed if i < max_depth]
            probs = None if self.probs is None else self.probs[:max_depth]
            return Proposal(self.tokens[:max_depth], probs, None, observed)
        depth = self.tree().depths()[1:]
        return self.subset([i for i, d in enumerate(depth) if d <= max_depth])

    def subset(self, keep: list[int]) -> Proposal:
        """The proposal with only the nodes `keep` (ascending, each node's parent kept too: a tree in
        parents-first order), renumbered; a chain cut to a prefix stays a chain."""
        if len(keep) == len(self.tokens):
            return self
        if self.parents is None:
            assert keep == list(range(len(keep))), "a chain keeps a prefix"
            return self.limited_to_depth(len(keep))
        new_index = {old: new for new, old in enumerate(keep)}
        return Proposal(
            [self.tokens[i] for i in keep],
            self.probs[keep] if self.probs is not None else None,
            [new_index.get(self.parents[i], -1) for i in keep],
            [new_index[i] for i in self.observed if i in new_index],
        )


class Proposer:
    """What the speculative step needs from a proposer; subclasses override what they do differently.

    One proposer object serves one sequence (it may keep per-sequence state such as a draft KV cache);
    `fresh()` makes another for a new sequence, sharing what is heavy (a draft model, head weights).
    """

    name: str = "proposer"
    proposes_trees: ClassVar[bool] = False  # may return Proposal.parents; K is then a node budget
    wants_features: ClassVar[bool] = False  # drafts from the target's hidden states (add_features)
    # With wants_features: needs the features of every committed position (EAGLE), not only the latest
    # (Medusa); a sequence that needs them all cannot reuse prefix-cache blocks, which hold no features.
    feature_history: ClassVar[bool] = False
    # Gets the target's greedy token at the root and at the proposal's `observed` rows after each
    # verification (observe_rows): Lookahead's Jacobi iterations. Such rows take full logits, not lazy ones.
    observes_rows: ClassVar[bool] = False
    # Proposers whose proposal shape fixes K (a node budget) set it; K is then neither the user's nor adaptive.
    node_budget: int | None = None
    # Draws its drafts under a constrained sequence's grammar: the engine sets `grammar` (a GrammarMatcher
    # at the context's end; the proposer must leave it as it found it) around propose() (draft models).
    samples_under_grammar: ClassVar[bool] = False
    grammar = None

    def fresh(self) -> Proposer:
        """A proposer for another sequence: shares this one's heavy parts, none of its per-sequence state."""
        return copy.copy(self)

    def for_another_engine(self) -> Proposer:
        """This proposer for another engine's sequences: the heavy parts shared, and none of the state it
        keeps across one engine's sequences (a draft's prompt memo). Stateless proposers are themselves."""
        return self

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        """Reset per-sequence state for a new prompt; `capacity` bounds the sequence length."""

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """Up to k tokens likely to follow `context` (all committed tokens so far)."""
        raise NotImplementedError

    def update(self, num_accepted: int) -> None:
        """How many of the last proposal's tokens the target accepted."""

    def catch_up_seconds(self, context: list[int]) -> float:
        """Seconds the next proposal would spend bringing a model of the proposer's own up to `context`
        before it drafts (a draft model's pass over a prompt it has not read), as measured so far; 0.0 for
        proposers that keep no such model, and before anything was measured."""
        return 0.0

    def drop_catch_up(self) -> bool:
        """That catch-up would not pay back: draft without it from now on. True when the proposer still
        has drafts to offer (the hybrid: prompt lookup alone), False when it has none (the sequence then
        decodes without speculation)."""
        return False

    def tree_depth(self, k: int) -> int:
        """The deepest a k-token proposal reaches (for the speculation controller): k for a chain."""
        return k

    def observe_rows(self, root: int, tokens: list[int]) -> None:
        """observes_rows proposers: the target's greedy next token after the pending token (root) and after
        each verified `observed` node (in order; a suffix may be missing where the budget cut it)."""
        raise NotImplementedError(f"{type(self).__name__} does not observe rows")

    def add_features(self, features: torch.Tensor) -> None:  # [n, hidden]
        """wants_features proposers: the target's features (hidden states after the final norm) of the
        next n committed positions. With L committed tokens the proposer holds f_0 .. f_{L-2}: the
        pending last token's feature comes with the next verification."""
        raise NotImplementedError(f"{type(self).__name__} does not take features")
