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
    """logits [rows, vocab] penalized (a new float32 tensor); row r as if `output_ids + paths[r]` were the
    output so far. Only the columns of tokens seen are read and written: a step costs what its context
    holds, not the vocabulary."""
    logits = logits.float().clone()
    drafted = [t for path in paths for t in path]
    repetition = params.repetition_penalty != 1.0
    seen = torch.tensor((prompt_ids if repetition else []) + output_ids + drafted, dtype=torch.long)
    if seen.numel() == 0:
        return logits
    columns = torch.unique(seen)  # sorted
    counts = torch.zeros(len(paths), columns.numel())
    if output_ids:
        counts += torch.bincount(torch.searchsorted(columns, torch.tensor(output_ids)), minlength=columns.numel())
    for r, path in enumerate(paths):
        if path:
            counts[r] += torch.bincount(torch.searchsorted(columns, torch.tensor(path)), minlength=columns.numel())
    values = logits[: len(paths), columns]
    if repetition:  # a row penalizes the prompt's tokens and its own output's (not another row's path)
        in_prompt = torch.zeros(columns.numel(), dtype=torch.bool)
        if prompt_ids:
            in_prompt[torch.searchsorted(columns, torch.tensor(prompt_ids))] = True
        hit = in_prompt | (counts > 0)
        penalty = params.repetition_penalty
        values = torch.where(hit, torch.where(values > 0, values / penalty, values * penalty), values)
    if params.frequency_penalty != 0.0:
        values = values - params.frequency_penalty * counts
    if params.presence_penalty != 0.0:
        values = values - params.presence_penalty * (counts > 0).float()
    logits[: len(paths), columns] = values
    return logits
