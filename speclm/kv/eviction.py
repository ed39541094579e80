"""Token-granular KV eviction (H2O, SnapKV): which of a sequence's cached tokens to keep, per layer and KV head.

Decisions only, on small per-sequence tensors: the engine (speclm/engine/eviction.py) feeds in the
attention weights of committed rows, asks `needs_eviction` before a step, and moves the kept entries
with PagedKVCache.compact. Each (layer, KV head) keeps its own tokens; the query heads of a GQA group
pool their weights. Keys keep the rotary phase of their original positions, and new tokens keep
counting positions from the sequence's length, so nothing is re-rotated.

The budget B holds at every decoding step: when a sequence's entries reach B, a batch of E entries is
evicted (down to B - E), leaving room for E - 1 steps (or draft rows) before the next eviction. A
prompt is prefilled whole, then cut to B - E before the first decoding step (as H2O and SnapKV do).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

SNAPKV_WINDOW = 32  # SnapKV's observation window: the prompt's last tokens, whose attention votes
SNAPKV_POOL = 7  # SnapKV's pooling kernel over positions (keeps the neighbours of a chosen token)
_PROTECTED = float("inf")
_LATER = 1e12  # SnapKV's first cut: entries it may not choose among are evicted after every candidate, oldest first


@dataclass(frozen=True)
class EvictionPlan:
    """One sequence's numbers: policy 'h2o' or 'snapkv', budget B, batch E, `sinks` first tokens always
    kept, `recent` last tokens always kept (H2O) or the observation window (SnapKV), prompt length."""

    policy: str
    budget: int
    batch: int
    sinks: int
    recent: int
    prompt_tokens: int

    @classmethod
    def of(cls, policy: str, budget: int, batch: int, sinks: int, prompt_tokens: int) -> EvictionPlan:
        room = budget - batch - sinks  # what the kept entries hold besides the sinks
        assert room >= 2 and policy in ("h2o", "snapkv"), (policy, budget, batch, sinks)
        recent = room // 2 if policy == "h2o" else min(SNAPKV_WINDOW, room // 2, prompt_tokens)
        return cls(policy, budget, batch, sinks, max(1, recent), prompt_tokens)

    @property
    def keep(self) -> int:
        """Entries left after an eviction."""
        return self.budget - self.batch


class SequenceEviction:
    """The entries one sequence holds, per (layer, KV head): their positions, their scores (H2O: the
    attention they received so far; SnapKV: the observation window's votes) and SnapKV's chosen ones."""

    def __init__(self, plan: EvictionPlan, num_layers: int, num_kv_heads: int) -> None:
        self.plan, self.shape = plan, (num_layers, num_kv_heads)
        self.reset()

    def reset(self) -> None:
        """Forget every entry (the sequence was preempted and is recomputed)."""
        self.positions = torch.zeros(*self.shape, 0, dtype=torch.long)  # [layers, kv_heads, held]
        self.scores = torch.zeros(*self.shape, 0)
        self.chosen = torch.zeros(*self.shape, 0, dtype=torch.bool)  # SnapKV: the prompt tokens it kept
        self.compressed = False  # SnapKV: its one selection was made
        self.num_evictions = 0

    def copy(self) -> SequenceEviction:
        other = SequenceEviction.__new__(SequenceEviction)
        other.__dict__.update(self.__dict__)
        for name in ("positions", "scores", "chosen"):
            setattr(other, name, getattr(self, name).clone())
        return other

    @property
    def held(self) -> int:
        return self.positions.shape[-1]

    def needs_eviction(self) -> bool:
        """True when the next token would exceed the budget."""
        return self.held >= self.plan.budget

    def room(self) -> int:
        """New entries (a step's rows) that fit before the next eviction."""
        return self.plan.budget - self.held

    def wants_weights(self, position: int) -> bool:
        """Whether the row of this position must report its attention weights (H2O: every committed row;
        SnapKV: the prompt's observation window, before its selection)."""
        if self.plan.policy == "h2o":
            return True
        p = self.plan.prompt_tokens
        return not self.compressed and p - self.plan.recent <= position < p

    def append(self, positions: list[int]) -> None:
        """New committed entries (after the held ones)."""
        n = len(positions)
        new = torch.tensor(positions, dtype=torch.long).expand(*self.shape, n)
        self.positions = torch.cat([self.positions, new], dim=-1)
        self.scores = torch.cat([self.scores, self.scores.new_zeros(*self.shape, n)], dim=-1)
        self.chosen = torch.cat([self.chosen, self.chosen.new_zeros(*self.shape, n)], dim=-1)

    def add_weights(self, weights: torch.Tensor) -> None:
        """Add one row's (or a summed chunk's) attention weights [layers, kv_heads, n <= held] to the
        scores of the first n entries."""
        n = weights.shape[-1]
        self.scores[..., :n] += weights

    def select(self, next_position: int) -> torch.Tensor:
        """Evict down to plan.keep entries: returns the kept entries' indices [layers, kv_heads, keep]
        (ascending) and drops the others from this state."""
        plan, pos = self.plan, self.positions
        sinks = pos < plan.sinks
        if plan.policy == "h2o":  # heavy hitters by accumulated attention, plus the recent window
            key = torch.where(sinks | (pos >= next_position - plan.recent), _PROTECTED, self.scores.double())
        elif not self.compressed:  # SnapKV's one selection: the window's pooled votes, per (layer, head)
            candidate = ~sinks & (pos < plan.prompt_tokens - plan.recent)
            votes = pooled_votes(torch.where(pos < plan.prompt_tokens - plan.recent, self.scores, 0.0)).double()
            key = torch.where(candidate, votes, _LATER + pos.double())
            key = torch.where(sinks, _PROTECTED, key)
        else:  # then a recent window: the oldest entries SnapKV did not choose go first
            key = torch.where(sinks | self.chosen, _PROTECTED, pos.double())
        kept = torch.sort(key, dim=-1, descending=True, stable=True).indices[..., : plan.keep]
        kept = kept.sort(dim=-1).values  # [layers, kv_heads, keep]: entries stay in position order
        if plan.policy == "snapkv" and not self.compressed:
            self.chosen = candidate
            self.compressed = True
        self.positions, self.scores, self.chosen = (
            t.gather(-1, kept) for t in (self.positions, self.scores, self.chosen)
        )
        self.num_evictions += 1
        return kept


def pooled_votes(votes: torch.Tensor, kernel: int = SNAPKV_POOL) -> torch.Tensor:
    """SnapKV's pooling: each entry's vote becomes the largest vote within kernel // 2 entries of it
    (max pooling along positions, stride 1), so chosen tokens bring their neighbours. [..., n] -> [..., n]."""
    shape = votes.shape
    flat = votes.reshape(-1, 1, shape[-1])
    return F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2).reshape(shape)
