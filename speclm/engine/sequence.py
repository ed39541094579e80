"""A sequence of tokens being generated (what the scheduler and the block manager reason about), and
the engine's per-sequence state around it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from speclm.engine.request import GenerationStats, Request
from speclm.engine.speculation import Speculation
from speclm.engine.stop import OutputTracker
from speclm.kv.eviction import SequenceEviction

if TYPE_CHECKING:
    from speclm.structured.matcher import GrammarMatcher


@dataclass
class Sequence:
    """One sequence of tokens being generated (a request has one per sample when n > 1).

    `num_computed` tokens have their keys/values in the cache; the rest of `token_ids` (the
    prompt, or the last sampled token) still has to run through the model.
    """

    seq_id: str
    prompt_ids: list[int]
    max_total_tokens: int  # prompt + generated tokens this sequence may reach
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_preemptions: int = 0
    finished: bool = False
    reuse_prefix: bool = True  # False: compute the whole prompt even when cached blocks hold a prefix
    max_cache_tokens: int | None = None  # KV entries it may hold at once, if fewer than max_total_tokens (eviction)

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed


@dataclass
class SequenceState:
    """Everything the engine keeps for one sequence: its request, tokens and stop tracking, its
    random stream, statistics, and its speculative decoding (None for plain decoding)."""

    request: Request
    index: int
    seq: Sequence
    tracker: OutputTracker
    generator: torch.Generator
    stats: GenerationStats
    prompt: str | None
    t_arrival: float
    forks: list[SequenceState] = field(default_factory=list)  # samples 1..n-1, forked after prefill
    speculation: Speculation | None = None
    # Its grammar (a constrained request), advanced over committed tokens; None: unconstrained, no mask work.
    matcher: GrammarMatcher | None = None
    logprobs: list = field(default_factory=list)  # TokenLogprob per committed token (requests that ask)
    eviction: SequenceEviction | None = None  # H2O / SnapKV: the KV entries it keeps (speclm/kv/eviction.py)

    def decodes_greedily(self) -> bool:
        """Whether its next step will take its row's argmax and, unless a stop condition ends it, another
        plain step follow: greedy, no penalty, no grammar, no drafting, no forks or eviction waiting, tokens left."""
        return (
            self.request.params.greedy
            and not self.request.params.penalized
            and self.matcher is None
            and self.speculation is None
            and not self.forks
            and self.eviction is None
            and self.seq.num_tokens + 1 < self.seq.max_total_tokens
        )
