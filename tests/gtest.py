"""A G-test of sampled token pairs against a model's exact two-token distribution: the distribution
enumerated with plain forward passes, and the test with small cells pooled. Shared by
tests/deploy/test_deploy.py and benchmarks/sampling_exactness/sampling_exactness.py."""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import power_divergence

from speclm.llm import LLM
from speclm.models.attention import AttentionMetadata
from speclm.sample.sampler import processed_probs
from speclm.sampling_params import SamplingParams


def exact_sequences(llm: LLM, prompt_ids: list[int], params: SamplingParams, length: int = 2) -> dict[tuple, float]:
    """P(t1, ..., t_length) under the processed distribution, over its support (top-k keeps it small)."""
    model, n = llm.model, len(prompt_ids)
    out: dict[tuple, float] = {}
    with torch.inference_mode():
        cache = model.new_cache(n + length)
        hidden = model(torch.tensor(prompt_ids), torch.arange(n), cache, AttentionMetadata(0, n))

        def walk(prefix: tuple, p: float, logits: torch.Tensor) -> None:
            probs = processed_probs(logits, params)[0].double()
            for t in torch.nonzero(probs).flatten().tolist():
                if len(prefix) + 1 == length:
                    out[(*prefix, t)] = p * float(probs[t])
                    continue
                at = n + len(prefix)  # (the cache past `at` is rewritten by each branch before it is read)
                h = model(torch.tensor([t]), torch.tensor([at]), cache, AttentionMetadata(at, 1))
                walk((*prefix, t), p * float(probs[t]), model.compute_logits(h))

        walk((), 1.0, model.compute_logits(hidden[-1:]))
    return out


def g_test(counts: dict, probs: dict, total: int) -> float:
    """G-test p-value; cells expected < 5 pooled, and sampled pairs outside the support counted there."""
    keys = sorted(probs)
    expected = np.array([probs[k] for k in keys]) / sum(probs.values()) * total
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    big = expected >= 5
    obs = np.append(observed[big], observed[~big].sum() + sum(v for k, v in counts.items() if k not in probs))
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        return 0.0 if obs[-1] else float(power_divergence(obs[:-1], exp[:-1], lambda_="log-likelihood").pvalue)
    return float(power_divergence(obs, exp, lambda_="log-likelihood").pvalue)
