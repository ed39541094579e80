"""Grammar masks applied to logits, before temperature, top-k and top-p, so the sampler, the draft model
and the verifier all work on the constrained target distribution; and the logprobs a response reports.

A mask is a bool tensor over the model's vocabulary, True where the grammar allows the token next:
[vocab] for one row, or [rows, vocab] for one mask per row (a draft chain's or tree's rows). Masking
before top-k/top-p makes them pick among allowed tokens only (top-k = 5 keeps the 5 most likely
*allowed* tokens), which is what sampling from "the model under the constraint" means.
"""

from __future__ import annotations

import numpy as np
import torch

from speclm.sample.sampler import processed_probs, sample_from_probs
from speclm.sampling_params import SamplingParams


def mask_logits(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """logits [rows, vocab] (or [vocab]) with disallowed tokens at -inf; a new tensor (float32).
    None = no constraint: the logits themselves, untouched (no copy)."""
    if mask is None:
        return logits
    if mask.shape[-1] != logits.shape[-1]:
        raise ValueError(f"mask covers {mask.shape[-1]} tokens, logits {logits.shape[-1]}")
    if logits.device.type == "cpu" and mask.device.type == "cpu":
        # numpy, not torch: torch spreads a vocabulary-sized op over its thread pool, whose start costs more
        # than the op (and far more while other processes hold the cores); numpy makes one pass on this thread.
        allowed = mask.numpy()
        assert allowed.any(-1).all(), "a row with no allowed token (a grammar dead end) must not reach sampling"
        return torch.from_numpy(np.where(allowed, logits.float().numpy(), np.float32(-np.inf)))
    assert bool(mask.any(-1).all()), "a row with no allowed token (a grammar dead end) must not reach sampling"
    return logits.float().masked_fill(~mask, float("-inf"))


def additive_mask(mask: torch.Tensor) -> torch.Tensor:
    """The same mask as a float bias: 0 where allowed, -inf elsewhere (to add to logits in place)."""
    return torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, float("-inf"))


def masked_probs(logits: torch.Tensor, params: SamplingParams, mask: torch.Tensor | None) -> torch.Tensor:
    """processed_probs of the masked logits [rows, vocab]: the constrained target (or draft) distribution.
    Zero on every disallowed token; greedy is one-hot on the best allowed token."""
    return processed_probs(mask_logits(logits, mask), params)


def select_masked(
    logits: torch.Tensor, params: SamplingParams, mask: torch.Tensor | None, generator: torch.Generator | None
) -> torch.Tensor:
    """Next tokens [rows] under the mask: the best allowed token when greedy, else a draw from masked_probs."""
    masked = mask_logits(logits, mask)
    if params.greedy:
        return masked.argmax(-1)
    return sample_from_probs(processed_probs(masked, params), generator)


def masked_target_logits(target_logits: torch.Tensor, row_masks: torch.Tensor | None) -> torch.Tensor:
    """The verifier's input under a constraint: target logits [num_rows, vocab] of a chain or tree pass,
    each row masked by the grammar's mask at that row (GrammarMatcher.tree_masks). RejectionSampler then
    verifies against the masked p; drafts must come from masked q (masked_probs of the draft's logits),
    so a draft token the grammar rejects has p = 0 and is never accepted."""
    return mask_logits(target_logits, row_masks)


def logprobs_of(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """The log-probabilities a response reports, [rows, vocab]: log-softmax of the target's logits at
    temperature 1, restricted to the grammar's allowed tokens and renormalized (a disallowed token is
    -inf). Temperature, top-k and top-p are not applied (OpenAI reports the model's probabilities, the
    same whatever the sampling settings). The target's logits at a position do not depend on how its
    tokens were proposed, so the values are the same with and without speculation."""
    return torch.log_softmax(mask_logits(logits, mask).float(), dim=-1)


def token_logprobs(
    logits: torch.Tensor, tokens: list[int], top_n: int, mask: torch.Tensor | None = None
) -> list[tuple[float, list[tuple[int, float]]]]:
    """For each row i: (logprob of tokens[i], the top_n (token, logprob) pairs, most likely first).

    logits [rows, vocab] are the target's rows that chose tokens [rows]; mask [rows, vocab] or None.
    Under a grammar only allowed tokens are listed, so fewer than top_n appear when fewer are allowed."""
    if len(tokens) != logits.shape[0]:
        raise ValueError(f"{len(tokens)} tokens for {logits.shape[0]} rows of logits")
    logprobs = logprobs_of(logits, mask)  # [rows, vocab]
    chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, dtype=torch.long)].tolist()
    out = []
    if top_n > 0:
        values, ids = torch.topk(logprobs, min(top_n, logprobs.shape[-1]), dim=-1)  # [rows, top_n]
        for row, value in enumerate(chosen):
            pairs = [(i, v) for i, v in zip(ids[row].tolist(), values[row].tolist()) if v != float("-inf")]
            out.append((value, pairs))
    else:
        out = [(value, []) for value in chosen]
    return out
