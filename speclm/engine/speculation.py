"""One sequence's speculative decoding: how many drafts it may propose this step (the K budget), the
proposal, its verification against the target's rows, and what the step teaches the K controller.
The engine calls these for every speculating sequence, so the speculative step exists once."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from speclm.sample.rejection import RejectionSampler, RowLogits, VerificationResult
from speclm.sample.tree import TokenTree
from speclm.sampling_params import SamplingParams
from speclm.speculative.controller import SpeculationController
from speclm.speculative.proposer import Proposal, Proposer

# Trees of this many nodes or more take their logits row by row along the verifier's walk: the
# head's matmul over the path's rows only costs less than over every row of a big tree.
LAZY_LOGITS_NODES = 4


@dataclass
class Speculation:
    """The speculative state of one sequence: its proposer, its K controller and this step's proposal."""

    proposer: Proposer
    controller: SpeculationController
    started: bool = False
    proposal: Proposal | None = None
    proposer_seconds: float = 0.0
    num_features: int = 0  # positions whose target features the proposer holds (feature proposers)
    num_verified: int = 0  # verification passes so far (the first proposal also caught up on the prompt)

    @classmethod
    def of(cls, proposer: Proposer, max_k: int, adaptive: bool) -> Speculation:
        if proposer.node_budget is not None:  # the proposal's shape is the method's (e.g. lookahead:W,N,G)
            max_k, adaptive = proposer.node_budget, False
        return cls(proposer, SpeculationController(max_k, adaptive, depth_of=proposer.tree_depth))

    def start(self, prompt_ids: list[int], max_total_tokens: int) -> None:
        if not self.started:
            self.proposer.start(prompt_ids, max_total_tokens + self.controller.max_k + 1)
            self.started = True

    def propose(
        self, context: list[int], wanted: int, room: int, params: SamplingParams, generator: torch.Generator
    ) -> int:
        """Draft for the step after `context`; returns how many drafts there are (0: none this step).

        `wanted`: tokens still wanted after the pending one; `room`: draft rows the sequence's cache
        can take. K drafts plus the bonus token must fit both; a tree's K counts its nodes, and only
        its depth is bounded by the tokens still wanted."""
        self.proposal = None
        k = min(self.controller.next_k(), room if self.proposer.proposes_trees else wanted, room)
        if k <= 0 or wanted <= 0:
            return 0
        t0 = time.perf_counter()
        proposal = self.proposer.propose(context, k, params, generator)
        self.proposal = proposal.limited_to_depth(wanted)
        self.proposer_seconds = time.perf_counter() - t0
        return len(self.proposal.tokens)

    def tree(self, granted: int) -> TokenTree:
        """The shape of the first `granted` drafts (parents come first, so a prefix is a tree)."""
        return self.proposal.tree(granted)

    def lazy_logits(self, tree: TokenTree) -> bool:
        """Whether a verification over `tree` computes its rows' logits on demand (see LAZY_LOGITS_NODES)."""
        return not self.proposer.observes_rows and not tree.is_chain() and tree.num_nodes >= LAZY_LOGITS_NODES

    def verify(
        self,
        verifier: RejectionSampler,
        rows: torch.Tensor | RowLogits,
        granted: int,
        params: SamplingParams,
        generator: torch.Generator,
    ) -> tuple[VerificationResult, TokenTree]:
        """The first `granted` drafts against their rows' logits ([1 + granted, vocab], or on demand)."""
        proposal, tree = self.proposal, self.tree(granted)
        probs = None if proposal.probs is None else proposal.probs[:granted]
        result = verifier.verify(rows, tree, proposal.tokens[:granted], probs, params, generator)
        if self.proposer.observes_rows:  # rows[0] is the pending token's; node i's is rows[i + 1]
            row = rows.__getitem__ if isinstance(rows, torch.Tensor) else rows
            nodes = [i for i in proposal.observed if i < granted]
            self.proposer.observe_rows(int(row(0).argmax()), [int(row(i + 1).argmax()) for i in nodes])
        return result, tree

    def record(self, tree: TokenTree, result: VerificationResult, target_seconds: float) -> None:
        """Teach the proposer and the K controller what this verification showed."""
        self.proposer.update(result.num_accepted)
        depth = None if tree.is_chain() else tree.max_depth
        self.controller.record(
            tree.num_nodes,
            result.num_accepted,
            self.proposer_seconds,
            target_seconds,
            depth,
            catch_up=self.num_verified == 0,
        )
        self.num_verified += 1
        self.proposal = None

    def record_plain_step(self, seconds: float) -> None:
        """A step without drafts: its cost is what speculation competes with."""
        self.controller.record(0, 0, 0.0, seconds)
