"""The default `draft:` proposer: prompt lookup where the context repeats itself, the draft model elsewhere,
chosen per step by which one is expected to commit more tokens per second."""

from __future__ import annotations

import copy
import time

import torch

from speclm.sampling_params import SamplingParams
from speclm.speculative.controller import SpeculationController
from speclm.speculative.draft_model import DraftModelProposer
from speclm.speculative.ngram import find_continuation, find_match, lookup_min_n
from speclm.speculative.proposer import Proposal, Proposer

LOOKUP = "lookup"
DRAFT = "draft"
# A constrained request (SamplingParams.constraint) drafts by lookup alone: its grammar's forced tokens and
# prompt lookup (single-token matches too) give free drafts, and on the real pair the draft model's
# passes and its read of each prompt cost more than its extra accepted tokens win back (JSON extraction
# and tool calls through the server, benchmarks/structured_pair/). `lookup=off` keeps the draft model.
CONSTRAINED_LOOKUP_ONLY = True


class HybridProposer(Proposer):
    """Prompt lookup (n-gram matches in the prompt and in the output so far) where a match exists, the
    draft model elsewhere.

    Each step with a match it compares the two by the measure the K controller uses (speclm/speculative/
    controller.py), with one SpeculationController per source as the estimator: expected tokens of
    the step (from that source's measured acceptance per draft position; lookup's per length of the
    matched suffix, since a 4-token match is a better bet than a 2-token one) over its cost (the
    measured verification time for that many drafts, plus K times the draft model's measured cost of
    a drafted token; a lookup costs microseconds). A source not measured yet is tried first, and a
    source that keeps losing is tried again every `explore_interval` losses, so its estimate follows
    the text. Verification time is what passes between a proposal and the engine's update() (the
    target's pass and the verifier; in a batch, the batch's pass).

    The draft model keeps its KV cache in sync by itself: before drafting it keeps the cached prefix
    that agrees with the committed context and feeds the rest in one pass, so tokens that lookup
    proposed and the target accepted (which it never drafted) are caught up on then. Its first
    proposal always runs the draft over the prompt, even when lookup drafts: the engine's controller
    counts a sequence's first proposal as prefill, not as drafting cost. Where that pass would not pay
    back (drop_catch_up: a long prompt and few tokens wanted, see speclm/engine/speculation.py), the
    draft model never reads the prompt and lookup drafts alone; a constrained request's always does
    (CONSTRAINED_LOOKUP_ONLY).

    Every proposal is a valid draft for the step whichever source made it, and the choice depends on
    earlier steps only, so the verifier keeps the output exact (greedy output equals plain decoding's).
    """

    explore_interval: int = 16

    samples_under_grammar = True

    def __init__(self, draft: DraftModelProposer, min_n: int = 2, max_n: int = 4, name: str = "hybrid") -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"prompt lookup needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.draft, self.min_n, self.max_n, self.name = draft, min_n, max_n, name
        self.proposes_trees = draft.proposes_trees  # a draft:PATH,branch=T tree; lookup drafts chains
        self._reset()

    def _reset(self) -> None:
        self.target_time: dict[int, float] = {}  # K -> seconds per verification, shared by both estimators
        self.draft_stats = self._estimator()
        self.lookup_stats: dict[int, SpeculationController] = {}  # matched suffix length -> estimator
        self.losses = {LOOKUP: 0, DRAFT: 0}
        self.proposals = {LOOKUP: 0, DRAFT: 0}  # how many steps each source drafted (this sequence)
        self.prefilled = False
        self.lookup_only = False  # the draft model's catch-up was dropped for this sequence
        self._pending: tuple | None = None  # (estimator, k, depth, seconds, catch_up, end time)

    def _estimator(self) -> SpeculationController:
        return SpeculationController(32, depth_of=self.draft.tree_depth, target_time=self.target_time)

    def fresh(self) -> HybridProposer:
        other = copy.copy(self)
        other.draft = self.draft.fresh()
        other._reset()
        return other

    def for_another_engine(self) -> HybridProposer:
        other = self.fresh()
        other.draft = self.draft.for_another_engine()
        return other

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self._reset()
        self.draft.start(prompt_ids, capacity)

    def tree_depth(self, k: int) -> int:
        return self.draft.tree_depth(k)

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        self._pending = None
        if CONSTRAINED_LOOKUP_ONLY and params.constraint is not None:
            self.lookup_only = True  # (a request's constraint lasts: catch_up_seconds need not price the draft)
            return Proposal(find_continuation(context, k, lookup_min_n(self.min_n, params), self.max_n))
        t0 = time.perf_counter()
        tokens, n = find_match(context, k, self.min_n, self.max_n)
        catch_up = not self.prefilled
        if tokens and (self.lookup_only or self._prefer_lookup(n, len(tokens), k)):
            if catch_up and not self.lookup_only:
                self.draft.sync(context)
            if n not in self.lookup_stats:  # (lookup alone: never compared with the draft, so never measured)
                self.lookup_stats[n] = self._estimator()
            proposal, stats, source = Proposal(tokens), self.lookup_stats[n], LOOKUP
        elif self.lookup_only:
            return Proposal()
        else:
            self.draft.grammar = self.grammar
            try:
                proposal = self.draft.propose(context, k, params, generator)
            finally:
                self.draft.grammar = None
            stats, source = self.draft_stats, DRAFT
        self.prefilled = True
        self.proposals[source] += 1
        end = time.perf_counter()
        depth = None if proposal.parents is None else proposal.tree().max_depth
        self._pending = (stats, len(proposal.tokens), depth, end - t0, catch_up, end)
        return proposal

    def catch_up_seconds(self, context: list[int]) -> float:
        return 0.0 if self.lookup_only else self.draft.catch_up_seconds(context)

    def drop_catch_up(self) -> bool:
        self.lookup_only = True
        return True

    def update(self, num_accepted: int) -> None:
        if self._pending is None:  # no proposal, or one the scheduler granted no rows
            return
        stats, k, depth, seconds, catch_up, end = self._pending
        self._pending = None
        if k:
            stats.record(k, num_accepted, seconds, time.perf_counter() - end, depth, catch_up=catch_up)

    def _prefer_lookup(self, n: int, m: int, k: int) -> bool:
        """Whether lookup's m drafts (after a match of n tokens) beat the draft model's k this step."""
        lookup = self.lookup_stats.setdefault(n, self._estimator())
        if not lookup.tries:  # never measured at this match length: measure it
            return True
        wins = self._rate(lookup, m, 0.0) > self._rate(self.draft_stats, k, self.draft_stats.draft_time or 0.0)
        loser = DRAFT if wins else LOOKUP
        self.losses[loser] += 1
        if self.losses[loser] >= self.explore_interval:  # re-measure the source that keeps losing
            self.losses[loser] = 0
            return not wins
        return wins

    def _rate(self, stats: SpeculationController, k: int, draft_time: float) -> float:
        """Expected tokens per second of a step with k drafts from the source `stats` measures."""
        verify = stats.target_seconds(k) if self.target_time else 1.0
        return stats.expected_tokens(k) / (verify + k * draft_time)
