"""A draft model's output head over a token map, and the context's tokens outside it."""

from __future__ import annotations

import copy

import torch
from torch import nn

from speclm.speculative.heads import cuts_rows_cheaply, draft_lm_head

MAX_CONTEXT_COLUMNS = 4096  # the most context tokens outside the token map one sequence's head adds


class DraftHead:
    """The columns a draft model scores: the whole vocabulary, or a `token_map` ([V'] token ids) plus the
    tokens of this sequence's context outside it (its own prompt's identifiers, mostly: a token seen in
    the context is likely to come again, and a map of frequent tokens misses the rare names a piece of
    code repeats). Their rows are cut from the whole head as they first appear, where that is cheap.
    Column j of `logits` is token `columns[j]` (None: the whole vocabulary, column j is token j); the
    draft's q is zero outside the columns, which the verifier handles like any other q."""

    def __init__(self, lm_head: nn.Module, token_map: torch.Tensor | None, vocab_size: int) -> None:
        self.whole, self.token_map, self.vocab_size = lm_head, token_map, vocab_size
        self.map_head = draft_lm_head(lm_head, token_map)  # over the token map when there is one
        adds_context = token_map is not None and cuts_rows_cheaply(lm_head)
        self.in_map = frozenset(token_map.tolist()) if adds_context else None  # None: no context columns
        self.reset()

    def reset(self) -> None:
        """A new sequence: no context columns yet."""
        self.columns = self.token_map
        self.context_ids: list[int] = []  # the context's tokens outside the map, as first seen
        self.context_set: set[int] = set()
        self.context_head = None  # the whole head's rows for them
        self.scanned = 0  # how much of the context was checked for them

    def for_sequence(self) -> DraftHead:
        """Another sequence's head: the same map and weights, columns of its own."""
        other = copy.copy(self)
        other.reset()
        return other

    def add_context(self, context: list[int]) -> None:
        """A column for each token of `context` (past the part already checked) that the columns lack."""
        if self.in_map is None or len(self.context_ids) >= MAX_CONTEXT_COLUMNS:
            return
        new = [t for t in dict.fromkeys(context[self.scanned :]) if t not in self.in_map and t not in self.context_set]
        self.scanned = len(context)
        new = new[: MAX_CONTEXT_COLUMNS - len(self.context_ids)]
        if not new:
            return
        self.context_ids += new
        self.context_set.update(new)
        ids = torch.tensor(self.context_ids, dtype=torch.long)
        self.context_head = draft_lm_head(self.whole, ids)
        self.columns = torch.cat([self.token_map, ids])

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits [rows, columns] of hidden states [rows, hidden]."""
        logits = self.map_head(hidden).float()
        if self.context_head is not None:
            logits = torch.cat([logits, self.context_head(hidden).float()], dim=-1)
        return logits

    def token(self, column: int) -> int:
        return column if self.columns is None else int(self.columns[column])

    def full_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """q over the columns [rows, columns] -> q over the vocabulary [rows, vocab], zero elsewhere."""
        if self.columns is None:
            return probs
        full = probs.new_zeros(probs.shape[0], self.vocab_size)
        full[:, self.columns] = probs
        return full

    def mask(self, mask: torch.Tensor) -> torch.Tensor:
        """A grammar's mask over the vocabulary (its length may differ from the head's) -> over the columns."""
        if self.columns is not None:
            return mask[self.columns]
        if mask.shape[0] >= self.vocab_size:
            return mask[: self.vocab_size]
        return torch.cat([mask, mask.new_zeros(self.vocab_size - mask.shape[0])])
