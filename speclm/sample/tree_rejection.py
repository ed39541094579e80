"""Exact verification of a token tree: walk from the root, accepting at most one child per node.

Greedy: follow the child equal to the target's argmax. Sampling is recursive rejection over the
siblings of the current node with a running residual p' (starting at the target's p there):
- deterministic candidates (no draft probabilities): accept child x with probability p'(x), else
  set p'(x) = 0 and renormalise. This draws from p by asking "is it x1? else is it x2? ..." and is
  exact for any candidates chosen without looking at the target's randomness;
- drafted candidates (x ~ q, siblings drawn independently from their parent's q): accept x with
  probability min(1, p'(x)/q(x)), else p' = normalize(max(0, p' - q)) (SpecInfer's multi-round
  speculative sampling; each round is a standard speculative step against the residual).
When every sibling fails, the token is drawn from p' (a *recovered* token); at a leaf it is drawn
from the target's p there (a *bonus* token).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from speclm.sample.rejection import VerificationResult
from speclm.sample.sampler import processed_probs, sample_from_probs
from speclm.sampling_params import SamplingParams
from speclm.spec.tree import TokenTree


@dataclass
class TreeVerificationResult(VerificationResult):
    """VerificationResult plus `path`: the accepted node indices from the root's child down."""

    path: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, tokens: list[int], path: list[int], bonus: bool) -> "TreeVerificationResult":
        return cls(tokens, len(path), bonus, path)


class TreeRejectionSampler:
    """Verifies a token tree against its rows of target logits (row 0 = the pending token)."""

    def verify(
        self,
        target_logits: torch.Tensor | Callable[[int], torch.Tensor],  # [num_nodes + 1, vocab], or row -> [vocab]
        tree: TokenTree,
        draft_tokens: list[int],  # [num_nodes]
        draft_probs: torch.Tensor | None,  # [num_nodes, vocab]: the q each node was drawn from; None = deterministic
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> TreeVerificationResult:
        assert tree.num_nodes == len(draft_tokens)
        children = tree.children()
        logits_of = target_logits if callable(target_logits) else target_logits.__getitem__
        if params.greedy:
            path, row = [], 0
            while True:
                choice = int(logits_of(row).argmax())
                nxt = next((c for c in children[row] if draft_tokens[c] == choice), None)
                if nxt is None:
                    return TreeVerificationResult.of([draft_tokens[c] for c in path] + [choice], path,
                                                  bool(path) and not children[row])
                path.append(nxt)
                row = nxt + 1
        path, row = [], 0
        while True:
            residual = processed_probs(logits_of(row)[None], params)[0]  # [vocab]: p at this row, then p-prime
            nxt = None
            for c in children[row]:
                x = draft_tokens[c]
                u = float(torch.rand(1, generator=generator))
                q_x = 1.0 if draft_probs is None else float(draft_probs[c, x])
                if u * q_x < float(residual[x]):
                    nxt = c
                    break
                residual = self.residual(residual, None if draft_probs is None else draft_probs[c], x)
            if nxt is None:
                token = int(sample_from_probs(residual[None], generator))
                return TreeVerificationResult.of([draft_tokens[c] for c in path] + [token], path,
                                              bool(path) and not children[row])
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
