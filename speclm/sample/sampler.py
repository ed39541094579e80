"""The processed next-token distribution (temperature, top-k, top-p, min-p) and drawing from it.

Plain decoding, draft models and the speculative verifier all call `processed_probs`, so the
distribution a draft proposes from and the one the target verifies against are computed alike.
"""

from __future__ import annotations

import torch

from speclm.sampling_params import SamplingParams


def processed_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities [rows, vocab] after temperature, top-k, top-p and min-p, in that order (as
    transformers' generate applies them; rows are independent).

    Greedy (temperature 0) gives a one-hot distribution on the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    # Shifted so the largest is 0 before dividing: no overflow however small the temperature.
    logits = (logits - logits.amax(-1, keepdim=True)) / params.temperature
    if 0 < params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [rows, 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs  # mass of strictly more likely tokens
        drop = mass_before >= params.top_p
        drop[..., 0] = False  # the most likely token always stays
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        probs = probs / probs.sum(-1, keepdim=True)
    if params.min_p > 0.0:  # relative to the most likely token, which always stays
        probs = probs.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token id per row of probs [rows, vocab] -> [rows]."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def select_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Next tokens [rows] for logits [rows, vocab]: argmax when greedy, else a draw."""
    if params.greedy:
        return logits.argmax(-1)
    return sample_from_probs(processed_probs(logits, params), generator)
