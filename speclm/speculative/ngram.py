"""Prompt-lookup proposer: continue the most recent earlier occurrence of the context's last n tokens."""

from __future__ import annotations

import numpy as np
import torch

from speclm.sampling_params import SamplingParams
from speclm.speculative.proposer import Proposal, Proposer

# The shortest match a constrained request (SamplingParams.constraint) looks up. Its drafts are cut at the
# first token the grammar rejects, so a coincidental match costs few rows, and the values a structured
# answer copies from the prompt follow tokens (a quote, a key) that the prompt's prose rarely has twice
# in a row: single-token matches raised constrained n-gram's tau on the real pair's JSON extraction
# (benchmarks/structured_pair/).
CONSTRAINED_MIN_N = 1


def lookup_min_n(min_n: int, params: SamplingParams) -> int:
    """The shortest suffix a lookup matches for a request: `min_n`, or CONSTRAINED_MIN_N under a grammar."""
    return min(min_n, CONSTRAINED_MIN_N) if params.constraint is not None else min_n


class NgramProposer(Proposer):
    """Match the last n tokens (n from max_n down to min_n) against prompt + output so far and
    propose the tokens that followed the latest match. Costs microseconds; no model involved.
    min_n defaults to 2: single-token matches are mostly coincidences whose drafts get rejected
    (benchmarks/spec_bench_smollm2_int4.md); a constrained request also takes them (lookup_min_n).
    """

    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram needs 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        return Proposal(find_continuation(context, k, lookup_min_n(self.min_n, params), self.max_n))


def find_continuation(context: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Up to k tokens following the latest earlier match of the longest matching suffix."""
    return find_match(context, k, min_n, max_n)[0]


def find_match(context: list[int], k: int, min_n: int, max_n: int) -> tuple[list[int], int]:
    """find_continuation's tokens and the length n of the suffix that matched (0: no match)."""
    ids = np.asarray(context, dtype=np.int64)
    total = len(ids)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = ids[total - n :]
        # Windows starting at 0 .. total-n-1 (excluding the suffix itself).
        windows = np.lib.stride_tricks.sliding_window_view(ids[: total - 1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return ids[start : start + k].tolist(), n
    return [], 0
