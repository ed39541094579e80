"""Exact speculative verification: accepted, recovered and bonus tokens.

Given target probabilities p and draft probabilities q over the same processed distribution, each
draft token x is accepted with probability min(1, p(x)/q(x)); at the first rejection a *recovered*
token is drawn from normalize(max(0, p - q)); when all K are accepted a *bonus* token is drawn from
the target's distribution after the last draft. The output is distributed exactly as the target alone
(Leviathan et al. 2023; Chen et al. 2023). Greedy verification accepts while the target's argmax agrees.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from speclm.sample.sampler import processed_probs, sample_from_probs
from speclm.sampling_params import SamplingParams


@dataclass
class VerificationResult:
    """`tokens` = the accepted draft tokens followed by one recovered token, or by a bonus token
    when every draft was accepted (`bonus`)."""

    tokens: list[int]
    num_accepted: int
    bonus: bool


class RejectionSampler:
    """Verifies K draft tokens against K+1 rows of target logits."""

    def verify(
        self,
        target_logits: torch.Tensor,  # [K+1, vocab]
        draft_tokens: list[int],  # K
        draft_probs: torch.Tensor | None,  # [K, vocab] processed draft distribution; None = one-hot drafts
        params: SamplingParams,
        generator: torch.Generator | None = None,
    ) -> VerificationResult:
        k = len(draft_tokens)
        assert target_logits.shape[0] == k + 1, (target_logits.shape, k)
        if params.greedy:
            return self._verify_greedy(target_logits, draft_tokens)
        return self.verify_probs(processed_probs(target_logits, params), draft_tokens, draft_probs, generator)

    @staticmethod
    def _verify_greedy(target_logits: torch.Tensor, draft_tokens: list[int]) -> VerificationResult:
        target_choice = target_logits.argmax(-1).tolist()  # [K+1]
        n = 0
        while n < len(draft_tokens) and draft_tokens[n] == target_choice[n]:
            n += 1
        return VerificationResult(draft_tokens[:n] + [target_choice[n]], n, 0 < n == len(draft_tokens))

    def verify_probs(
        self,
        target_probs: torch.Tensor,  # [K+1, vocab]
        draft_tokens: list[int],
        draft_probs: torch.Tensor | None,  # [K, vocab] or None for deterministic (one-hot) drafts
        generator: torch.Generator | None,
    ) -> VerificationResult:
        k = len(draft_tokens)
        if k == 0:
            return VerificationResult([int(sample_from_probs(target_probs[:1], generator))], 0, False)
        rows = torch.arange(k)
        drafted = torch.tensor(draft_tokens)
        p_x = target_probs[rows, drafted]  # [K]
        q_x = draft_probs[rows, drafted] if draft_probs is not None else torch.ones(k)
        uniforms = torch.rand(k, generator=generator)
        # u < p/q  <=>  u * q < p (q > 0 for a token the draft produced)
        accepted = (uniforms * q_x < p_x).tolist()
        n = accepted.index(False) if False in accepted else k
        if n == k:
            bonus = int(sample_from_probs(target_probs[k : k + 1], generator))
            return VerificationResult(draft_tokens + [bonus], k, True)
        recovered = int(sample_from_probs(self.residual(target_probs[n], draft_probs, draft_tokens, n)[None], generator))
        return VerificationResult(draft_tokens[:n] + [recovered], n, False)

    @staticmethod
    def residual(p: torch.Tensor, draft_probs: torch.Tensor | None, draft_tokens: list[int], i: int) -> torch.Tensor:
        """normalize(max(0, p - q)) at draft position i."""
        if draft_probs is None:
            r = p.clone()
            r[draft_tokens[i]] = 0.0
        else:
            r = (p - draft_probs[i]).clamp_min(0.0)
        total = r.sum()
        # Rejection implies p(x) < q(x), so some mass lies elsewhere; guard against fp underflow anyway.
        return r / total if total > 0 else p
