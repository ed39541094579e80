"""Lookahead decoding (Fu et al., 2024): no draft model; the target's own Jacobi iterations over a window
of future positions feed an n-gram pool, and pool n-grams that start with the pending token are verified
in the same pass as the window.

Each step proposes one token tree over the pending token:
  - up to G candidate branches: the pool's most recent n-grams starting with the pending token (N-1
    tokens each), plus prompt lookup's continuation (the pool is shared with it);
  - the lookahead branch: the current guesses for the next W positions, as a chain.
After the pass, the target's greedy token at the root and at every window row is a Jacobi update: row j's
token is the new guess for the position after it. N-grams are read diagonally across the last N-1
iterations (the token at position p from this iteration's inputs, at p-1 from the previous one's, and
so on), as in the paper's 2D window, and added to the pool.

The verifier accepts the longest branch prefix the target agrees with (any branch, the window's too), so
greedy output equals plain decoding's and sampling stays exact (deterministic drafts, one-hot q).
"""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from typing import ClassVar

import torch

from speclm.sampling_params import SamplingParams
from speclm.speculative.ngram import find_continuation
from speclm.speculative.proposer import Proposal, Proposer


class LookaheadProposer(Proposer):
    name = "lookahead"
    proposes_trees = True
    observes_rows = True

    # Pool entries kept per first token (least recently seen dropped first).
    POOL_PER_TOKEN: ClassVar[int] = 16

    def __init__(self, window: int = 5, ngram: int = 3, guesses: int = 3) -> None:
        if window < 1 or ngram < 2 or guesses < 0:
            raise ValueError(f"lookahead needs W >= 1, N >= 2, G >= 0; got {window}, {ngram}, {guesses}")
        self.window, self.n, self.guesses = window, ngram, guesses
        self.node_budget = guesses * (ngram - 1) + (ngram - 1) + window  # candidates + prompt lookup + window
        self._reset()

    def _reset(self) -> None:
        self.pool: dict[int, OrderedDict[tuple[int, ...], None]] = defaultdict(OrderedDict)
        self.inputs: dict[int, int] = {}  # this iteration's window guesses by absolute position
        self.levels: list[dict[int, int]] = []  # earlier iterations' guesses (newest last), N-2 kept
        self.context: list[int] = []

    def fresh(self) -> LookaheadProposer:
        other = copy.copy(self)
        other._reset()
        return other

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self._reset()

    def tree_depth(self, k: int) -> int:
        return min(k, max(self.window, self.n - 1))

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        self.context = context
        pending = len(context) - 1  # the pending token's absolute position
        branches: list[list[int]] = []
        lookup = find_continuation(context, self.n - 1, 2, 4)
        if lookup:
            branches.append(lookup)
        for gram in reversed(self.pool.get(context[-1], {})):
            if len(branches) > self.guesses:
                break
            if list(gram) not in branches:
                branches.append(list(gram))
        tokens: list[int] = []
        parents: list[int] = []
        for branch in branches:  # prompt lookup's and at most G from the pool
            for i, token in enumerate(branch):
                parents.append(-1 if i == 0 else len(tokens) - 1)
                tokens.append(token)
        guesses = [self._guess(p) for p in range(pending + 1, pending + 1 + self.window)]
        self.inputs = dict(zip(range(pending + 1, pending + 1 + self.window), guesses))
        window_nodes = []
        for i, token in enumerate(guesses):
            parents.append(-1 if i == 0 else len(tokens) - 1)
            window_nodes.append(len(tokens))
            tokens.append(token)
        return Proposal(tokens[:k], None, parents[:k], observed=[i for i in window_nodes if i < k])

    def _guess(self, position: int) -> int:
        """The current guess for an absolute position: the last Jacobi update there, else a token of the
        context (the paper starts its window from prompt tokens)."""
        if position in self.inputs:
            return self.inputs[position]
        return self.context[(position * 7919) % len(self.context)]

    def observe_rows(self, root: int, tokens: list[int]) -> None:
        pending = len(self.context) - 1
        # The target's greedy token for each position: after the pending token, and after window row j.
        outputs = {pending + 1: root}
        for j, token in enumerate(tokens):
            outputs[pending + 2 + j] = token
        for position, token in outputs.items():
            gram = self._diagonal(position - 1)
            if gram is not None:
                first, *rest = gram + [token]
                entries = self.pool[first]
                entries[tuple(rest)] = None
                entries.move_to_end(tuple(rest))
                while len(entries) > self.POOL_PER_TOKEN:
                    entries.popitem(last=False)
        self.levels = (self.levels + [self.inputs])[-(self.n - 2) :] if self.n > 2 else []
        self.inputs = outputs  # the next iteration's guesses (positions at or before its pending token drop)

    def _diagonal(self, position: int) -> list[int] | None:
        """N-1 tokens ending at `position`: this iteration's input there, the previous iteration's at the
        position before, ... (committed tokens where a position is in the context); None if one is missing."""
        pending = len(self.context) - 1
        sources = [self.inputs, *reversed(self.levels)]
        gram = []
        for back in range(self.n - 1):
            p = position - back
            if p < 0:
                return None
            if p <= pending:
                gram.append(self.context[p])
            elif back < len(sources) and p in sources[back]:
                gram.append(sources[back][p])
            else:
                return None
        return gram[::-1] if len(gram) == self.n - 1 else None
