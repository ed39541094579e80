"""One sequence's speculative decoding: its proposer (started on first use, fed the target's features),
how many drafts it may propose this step (the K budget), the proposal, its verification against the
target's rows, and what the step teaches the K controller and the request's statistics. The engine
calls these for every speculating sequence, so the speculative step exists once."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from speclm.engine.request import GenerationStats
from speclm.sample.rejection import RejectionSampler, VerificationResult
from speclm.sample.row_logits import RowLogits
from speclm.sample.tree import TokenTree
from speclm.sampling_params import SamplingParams
from speclm.speculative.controller import PassCosts, SpeculationController
from speclm.speculative.proposer import Proposal, Proposer

if TYPE_CHECKING:
    from speclm.structured.matcher import GrammarMatcher

# Trees of this many nodes or more take their logits row by row along the verifier's walk: the
# head's matmul over the path's rows only costs less than over every row of a big tree.
LAZY_LOGITS_NODES = 4
# A proposer's catch-up (a draft model reading a prompt, or a context that grew while the batch was too
# big to speculate) is made only if it costs at most this share of the target's expected time for the
# tokens still wanted: it must be paid back by drafting the rest, which takes a 1.07x speedup from the
# draft for this share alone. On the pair the draft runs its decoding at ~1.0-1.3x on 600-800-token
# prompts, where prompt lookup alone does as well (benchmarks/serve_catch_up/); since prompt passes got
# faster such a prompt costs 0.10-0.14 of the time for 256 tokens (it was ~0.2), so the share sits below
# that; at the draft's 1.2-1.5 ms a prompt token, a 300-token prompt costs ~0.05
# (benchmarks/prefill_malloc/catch_up_share.md).
CATCH_UP_SHARE = 1 / 16


@dataclass
class Speculation:
    """The speculative state of one sequence: its proposer, its K controller and this step's proposal."""

    proposer: Proposer
    controller: SpeculationController
    prompt_ids: list[int]
    capacity: int  # tokens the proposer may have to hold: the sequence's, plus a step's drafts and bonus
    costs: PassCosts  # the engine's: what a target pass costs a sequence, measured over all of them
    started: bool = False
    declined: bool = False  # the proposer's catch-up would not pay and it has nothing else: no more drafts
    behind: bool = False  # steps without drafts since the last proposal: the next one also reads their tokens
    proposal: Proposal | None = None
    proposer_seconds: float = 0.0
    num_features: int = 0  # positions whose target features the proposer holds (feature proposers)
    num_verified: int = 0  # verification passes so far (the first proposal also caught up on the prompt)
    observing: bool = False  # this step's proposal came from an observes_rows proposer (it gets its rows)
    proposed: bool = False  # the proposer drafted this step (a constrained step may be forced tokens only)
    num_forced: int = 0  # this step's leading drafts that the grammar forced
    row_masks: torch.Tensor | None = None  # the grammar's masks of the last verification's rows [rows, vocab]

    @classmethod
    def of(
        cls,
        proposer: Proposer,
        max_k: int,
        adaptive: bool,
        prompt_ids: list[int],
        max_total_tokens: int,
        costs: PassCosts,
    ) -> Speculation:
        if proposer.node_budget is not None:  # the proposal's shape is the method's (e.g. lookahead:W,N,G)
            max_k, adaptive = proposer.node_budget, False
        controller = SpeculationController(max_k, adaptive, depth_of=proposer.tree_depth)
        return cls(proposer, controller, prompt_ids, max_total_tokens + max_k + 1, costs)

    def _started(self) -> Proposer:
        """The proposer, started for this sequence's prompt on first use (a waiting sequence holds no
        proposer state, e.g. a draft model's cache)."""
        if not self.started:
            self.proposer.start(self.prompt_ids, self.capacity)
            self.started = True
        return self.proposer

    def add_features(self, start: int, features: torch.Tensor) -> None:
        """Hand a feature proposer the target features ([n, hidden]) of positions start..start+n-1,
        whose next tokens are committed, minus those it holds already (a preempted sequence recomputes)."""
        if not self.proposer.wants_features:
            return
        proposer = self._started()
        skip = self.num_features - start
        if skip < 0:  # a prefix-cache hit computed no features there
            assert not proposer.feature_history, "features skipped"
            skip = 0
        if skip < features.shape[0]:
            proposer.add_features(features[skip:].clone())  # a copy: the step's hidden states are freed
            self.num_features = start + features.shape[0]

    def propose(
        self,
        context: list[int],
        wanted: int,
        room: int,
        params: SamplingParams,
        generator: torch.Generator,
        matcher: GrammarMatcher | None = None,
    ) -> list[int]:
        """Draft for the step after `context`; returns the draft tokens (none this step: empty).

        `wanted`: tokens still wanted after the pending one; `room`: draft rows the sequence's cache
        can take. K drafts plus the bonus token must fit both; a tree's K counts its nodes, and only
        its depth is bounded by the tokens still wanted. `matcher` (a constrained sequence, at the
        pending token): see _constrained."""
        proposer = self._started()
        self.proposal = None
        self.observing, self.proposed, self.num_forced = proposer.observes_rows, True, 0
        if not self.declined:
            pays = self._catch_up_pays(proposer, context, wanted)
            if pays is None:  # a plain step first: it measures what the catch-up is weighed against
                return []
            if not pays:
                self.declined = not proposer.drop_catch_up()
        if matcher is not None:
            return self._constrained(proposer, context, wanted, room, params, generator, matcher)
        if self.declined:
            return []
        k = min(self.controller.next_k(), room if proposer.proposes_trees else wanted, room)
        if k <= 0 or wanted <= 0:
            return []
        t0 = time.perf_counter()
        proposal = proposer.propose(context, k, params, generator)
        self.proposal = proposal.limited_to_depth(wanted)
        self.proposer_seconds = time.perf_counter() - t0
        return self.proposal.tokens

    def _constrained(
        self,
        proposer: Proposer,
        context: list[int],
        wanted: int,
        room: int,
        params: SamplingParams,
        generator: torch.Generator,
        matcher: GrammarMatcher,
    ) -> list[int]:
        """A constrained sequence's drafts: the tokens its grammar forces next (jump-forward: free,
        deterministic drafts), then the proposer's drafts after them. A draft model draws them from
        its own masked distribution (samples_under_grammar), a draft tree masked per node. Deterministic
        drafts (n-gram, heads, greedy drafts; chains and trees) lose every node the grammar rejects and
        the nodes below it: such a draft is rejected for sure by the masked target (its one-hot q leaves
        the residual unchanged), so the cut changes nothing but the wasted rows. Sampled drafts are never
        cut (cutting where a draw happened to leave the grammar would bias the output; the masked
        verifier rejects such a draw exactly: its token is masked out at its parent).
        Lookahead (it observes its own rows) drafts alone, or forced tokens alone when there are any."""
        if wanted <= 0 or room <= 0:
            return []
        t0 = time.perf_counter()
        forced = matcher.forced_tokens()[: min(wanted, room)]
        k = min(self.controller.next_k(), room - len(forced), wanted - len(forced))
        if proposer.proposes_trees:
            k = min(self.controller.next_k(), room - len(forced))
        if (forced and proposer.observes_rows) or self.declined:  # (forced tokens are drafts of their own)
            k, self.observing = 0, False
        proposal = Proposal()
        if k > 0:
            under_grammar = proposer.samples_under_grammar
            if under_grammar:  # a draft model draws from its masked distribution, after the forced tokens
                matcher.advance(forced)
                proposer.grammar = matcher
            try:
                proposal = proposer.propose(context + forced, k, params, generator)
            finally:
                if under_grammar:
                    proposer.grammar = None
                    matcher.rollback(len(forced))
            proposal = proposal.limited_to_depth(wanted - len(forced))
            if proposal.probs is None or params.greedy:  # deterministic drafts: cut what the grammar rejects
                matcher.advance(forced)
                keep = matcher.valid_nodes(proposal.tree(), proposal.tokens)
                matcher.rollback(len(forced))
                proposal = proposal.subset(keep)
        self.proposed, self.num_forced = k > 0, len(forced)
        self.proposal = _after(forced, proposal)
        self.proposer_seconds = time.perf_counter() - t0
        return self.proposal.tokens

    def _catch_up_pays(self, proposer: Proposer, context: list[int], wanted: int) -> bool | None:
        """Whether the proposer's catch-up before this proposal (if any) costs at most CATCH_UP_SHARE of
        the target's expected time for the `wanted` tokens (a plain pass's measured cost for this
        sequence, each). None: the engine has measured no target pass yet (its first decoding step); made
        unpriced, a draft's read of a long prompt on a slow machine cost more than the whole request gained
        (benchmarks/avx2_kernel/off_steps_rag.md), so the step runs without drafts and is measured."""
        seconds = proposer.catch_up_seconds(context)
        if seconds <= 0.0:
            return True
        step = self.costs.seconds(0)
        return None if step is None else seconds <= CATCH_UP_SHARE * wanted * step

    def tree(self, granted: int) -> TokenTree:
        """The shape of the first `granted` drafts (parents come first, so a prefix is a tree)."""
        return self.proposal.tree(granted)

    def lazy_logits(self, tree: TokenTree) -> bool:
        """Whether a verification over `tree` computes its rows' logits on demand (see LAZY_LOGITS_NODES)."""
        return not self.proposer.observes_rows and not tree.is_chain() and tree.num_nodes >= LAZY_LOGITS_NODES

    def verify(
        self,
        verifier: RejectionSampler,
        rows: RowLogits,
        draft_tokens: list[int],
        params: SamplingParams,
        generator: torch.Generator,
        matcher: GrammarMatcher | None = None,
        history: tuple[list[int], list[int]] = ([], []),
    ) -> tuple[VerificationResult, TokenTree]:
        """The granted drafts (the proposal's first ones) against their rows' logits (1 + len(draft_tokens)
        rows); under a grammar (`matcher`, at the pending token) against the masked rows, so what is
        committed is distributed as the constrained target; under penalties (`params.penalized`) against
        rows penalized with `history` (the prompt's and the output's tokens so far) and each row's path."""
        granted = len(draft_tokens)
        proposal, tree = self.proposal, self.tree(granted)
        probs = None if proposal.probs is None else proposal.probs[:granted]
        raw, self.row_masks = rows, None
        if params.penalized:
            paths = [[draft_tokens[r - 1] for r in path[1:]] for path in tree.row_paths()]
            rows = rows.penalized(params, history[0], history[1], paths)
        if matcher is not None:
            with matcher.timed():
                self.row_masks = matcher.tree_masks(tree, draft_tokens)[0]
                rows = rows.masked(self.row_masks)
        result = verifier.verify(rows, tree, draft_tokens, probs, params, generator)
        rows = raw
        if self.observing:  # rows[0] is the pending token's; node i's is rows[i + 1]
            nodes = [i for i in proposal.observed if i < granted]
            argmax = rows.argmax_of()
            self.proposer.observe_rows(argmax(0), [argmax(i + 1) for i in nodes])
        return result, tree

    def record(
        self, tree: TokenTree, result: VerificationResult, target_seconds: float, stats: GenerationStats
    ) -> None:
        """Teach the proposer, the K controller and the request's statistics what this verification showed."""
        stats.proposer_seconds += self.proposer_seconds
        stats.target_seconds += target_seconds
        stats.forced_tokens += min(self.num_forced, result.num_accepted)  # (a forced draft is always accepted)
        if self.proposed:  # (the drafts after the forced ones are the proposer's)
            self.proposer.update(max(0, result.num_accepted - self.num_forced))
        depth = None if tree.is_chain() else tree.max_depth
        self.controller.record(
            tree.num_nodes,
            result.num_accepted,
            self.proposer_seconds,
            target_seconds,
            depth,
            catch_up=self.num_verified == 0 or self.behind,
        )
        self.behind = False
        self.costs.record(tree.num_nodes, target_seconds)
        self.num_verified += 1
        self.proposal = None

    def record_plain_step(self, seconds: float) -> None:
        """A step without drafts: its cost is what speculation competes with. A proposer that keeps a model
        of its own (a draft model) reads this step's token at its next proposal, with any others it
        missed: that proposal's time is catching up, not drafting (charged as drafting, a probe after
        speculation turned off would price each drafted token at the whole catch-up, and keep it off)."""
        self.controller.record(0, 0, 0.0, seconds)
        self.behind = True
        self.costs.record(0, seconds)


def _after(forced: list[int], proposal: Proposal) -> Proposal:
    """The forced tokens as a chain of deterministic drafts, then `proposal` below its last one
    (forced rows of a sampled proposal get one-hot q: accepted with the target's probability, as
    deterministic drafts are)."""
    if not forced:
        return proposal
    f = len(forced)
    parents = None
    if proposal.parents is not None:
        parents = list(range(-1, f - 1)) + [p + f if p >= 0 else f - 1 for p in proposal.parents]
    probs = None
    if proposal.probs is not None:
        one_hot = proposal.probs.new_zeros(f, proposal.probs.shape[1])
        one_hot[torch.arange(f), torch.tensor(forced)] = 1.0
        probs = torch.cat([one_hot, proposal.probs])
    return Proposal(forced + proposal.tokens, probs, parents, [i + f for i in proposal.observed])
