"""Exact speculative verification of a token tree (a chain is a tree with one child per node): the
accepted path, then a recovered or a bonus token.

Walk from the root, accepting at most one child per node. Greedy: follow the child equal to the
target's argmax. Sampling is recursive rejection over the siblings of the current node with a running
residual p' (starting at the target's processed p there):
- deterministic candidates (no draft probabilities: n-grams, head top-k): accept child x with
  probability p'(x), else set p'(x) = 0 and renormalise. This draws from p by asking "is it x1? else
  is it x2? ..." and is exact for candidates chosen without looking at the target's randomness;
- drafted candidates (x ~ q, siblings drawn independently from their parent's q): accept x with
  probability min(1, p'(x)/q(x)), else p' = normalize(max(0, p' - q)) (SpecInfer's multi-round
  speculative sampling). With one child per node this is the speculative sampling of Leviathan et
  al. (2023) and Chen et al. (2023).
When every child fails, the next token is drawn from p' (a *recovered* token); at a leaf it is drawn
from the target's p there (a *bonus* token). The output is distributed exactly as the target alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from speclm.sample.row_logits import RowLogits
from speclm.sample.sampler import sample_from_probs
from speclm.sample.tree import TokenTree
from speclm.sampling_params import SamplingParams


@dataclass
class VerificationResult:
    """`tokens` = the accepted drafts followed by one recovered token, or by a bonus token when the
    walk ended at a leaf (`bonus`); `path` = the accepted node indices from the root's child down."""

    tokens: list[int]
    num_accepted: int
    bonus: bool
    path: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, tokens: list[int], path: list[int], bonus: bool) -> VerificationResult:
        return cls(tokens, len(path), bonus, path)


class RejectionSampler:
    """Verifies draft tokens (a tree, or a chain) against the target's logits of their rows (row 0 =
    the pending token, row 1+i = draft node i)."""

    def verify(
        self,
        target_logits: RowLogits,  # rows 0..num_nodes of the target's logits
        tree: TokenTree,
        draft_tokens: list[int],  # [num_nodes]
        draft_probs: torch.Tensor | None,  # [num_nodes, vocab]: the q each node was drawn from; None = deterministic
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> VerificationResult:
        assert tree.num_nodes == len(draft_tokens)
        children = tree.children()
        if params.greedy:
            return self._walk_greedy(children, draft_tokens, target_logits.argmax_of())
        return self._walk_sampled(children, draft_tokens, draft_probs, target_logits.probs_of(params), generator)

    @staticmethod
    def _walk_greedy(
        children: list[list[int]], draft_tokens: list[int], choice_of: Callable[[int], int]
    ) -> VerificationResult:
        path, row = [], 0
        while True:
            choice = choice_of(row)
            nxt = next((c for c in children[row] if draft_tokens[c] == choice), None)
            if nxt is None:
                return VerificationResult.of(
                    [draft_tokens[c] for c in path] + [choice], path, bool(path) and not children[row]
                )
            path.append(nxt)
            row = nxt + 1

    def _walk_sampled(
        self,
        children: list[list[int]],
        draft_tokens: list[int],
        draft_probs: torch.Tensor | None,
        p_of: Callable[[int], torch.Tensor],
        generator: torch.Generator | None,
    ) -> VerificationResult:
        path, row = [], 0
        while True:
            residual = p_of(row)  # [vocab]: p at this row, then p-prime
            nxt = None
            for c in children[row]:
                x = draft_tokens[c]
                u = float(torch.rand(1, generator=generator))
                q_x = 1.0 if draft_probs is None else float(draft_probs[c, x])
                if u * q_x < float(residual[x]):  # u < p'(x) / q(x), q(x) > 0 for a drafted x
                    nxt = c
                    break
                residual = self.residual(residual, None if draft_probs is None else draft_probs[c], x)
            if nxt is None:
                token = int(sample_from_probs(residual[None], generator))
                return VerificationResult.of(
                    [draft_tokens[c] for c in path] + [token], path, bool(path) and not children[row]
                )
            path.append(nxt)
            row = nxt + 1

    @staticmethod
    def residual(p: torch.Tensor, q: torch.Tensor | None, x: int) -> torch.Tensor:
        """The running distribution after candidate x (drawn from q; None = deterministic) failed."""
        if q is None:
            r = p.clone()
            r[x] = 0.0
        else:
            r = (p - q).clamp_min(0.0)
        total = r.sum()
        # A rejection implies mass elsewhere (p'(x) < 1, or p' != q); guard against fp underflow anyway.
        return r / total if total > 0 else p
