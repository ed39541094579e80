"""Repetition, frequency and presence penalties on rows of logits, each row with the tokens before it.

A penalized step's distribution depends on the tokens before it, so a verification row must see its own
path's drafts as already generated: row r is penalized with the output so far plus `paths[r]` (the drafts
from the root down to that row's node). Plain decoding calls the same function with an empty path, so both
compute the same logits for the same context and speculation stays exact. The order is vLLM's: repetition
(over prompt and output), then frequency and presence (over the output only, as OpenAI defines them).
"""

from __future__ import annotations

import torch

from speclm.sampling_params import SamplingParams


def penalize(
    logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int], output_ids: list[int], paths: list[list[int]]
) -> torch.Tensor:
    """logits [rows, vocab] (float32) penalized; row r as if `output_ids + paths[r]` were the output so far."""
    rows, vocab = logits.shape
    output = torch.zeros(rows, vocab, dtype=torch.float32)
    if output_ids:
        output += torch.bincount(torch.tensor(output_ids), minlength=vocab)[:vocab].float()
    for r, path in enumerate(paths):
        for token in path:
            output[r, token] += 1.0
    logits = logits.float()
    if params.repetition_penalty != 1.0:
        seen = output > 0
        if prompt_ids:
            seen[:, torch.tensor(prompt_ids)] = True
        penalty = params.repetition_penalty
        logits = torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)
    if params.frequency_penalty != 0.0:
        logits = logits - params.frequency_penalty * output
    if params.presence_penalty != 0.0:
        logits = logits - params.presence_penalty * (output > 0).float()
    return logits
