"""Speculative sampling on the GPU follows the target's distribution (G-test over the first two tokens,
as tests/speculative/test_exactness.py on the CPU), and the same test rejects a verifier that skips the
residual (negative control). The p-value comes from torch (no scipy on the GPU machine)."""

from __future__ import annotations

import pytest
import torch

from speclm import SamplingParams
from speclm.models.attention import AttentionMetadata
from speclm.sample.rejection import RejectionSampler
from speclm.sample.sampler import processed_probs
from tests.cuda.conftest import needs_cuda

pytestmark = needs_cuda

NUM_SAMPLES = 1500
ALPHA = 1e-3
PARAMS = SamplingParams(temperature=1.5)


class ResidualSkippingVerifier(RejectionSampler):
    @staticmethod
    def residual(p, q, x):
        return p


def exact_two_token_distribution(llm, prompt_ids: list[int]) -> torch.Tensor:
    model, n, device = llm.model, len(prompt_ids), llm.model.device
    vocab = model.config.vocab_size
    joint = torch.zeros(vocab, vocab, dtype=torch.float64)
    cache = model.new_cache(n + 1)
    hidden = model(
        torch.tensor(prompt_ids, device=device), torch.arange(n, device=device), cache, AttentionMetadata(0, n)
    )
    p1 = processed_probs(model.compute_logits(hidden[-1:]), PARAMS)[0]
    cache.truncate(n)
    for t1 in torch.nonzero(p1).flatten().tolist():
        step = model(
            torch.tensor([t1], device=device), torch.tensor([n], device=device), cache, AttentionMetadata(n, 1)
        )
        cache.truncate(n)
        joint[t1] = p1[t1].double() * processed_probs(model.compute_logits(step), PARAMS)[0].double()
    return joint


def sample_two_tokens(llm, prompt_ids: list[int]) -> torch.Tensor:
    vocab = llm.model.config.vocab_size
    counts = torch.zeros(vocab, vocab, dtype=torch.float64)
    drafted = 0
    for seed in range(NUM_SAMPLES):  # (three tokens: the step after the prompt's verifies a draft for the second)
        run = SamplingParams(temperature=PARAMS.temperature, seed=seed, max_tokens=3, ignore_eos=True)
        out = llm.generate(prompt_ids, run)[0]
        t1, t2 = out.token_ids[:2]
        counts[t1, t2] += 1
        drafted += out.stats.drafted_tokens
    assert drafted > 0 or llm.spec is None
    return counts


def g_test_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """G-test (cells expected < 5 pooled); p from the chi-square survival function, gammaincc(df/2, G/2)."""
    assert counts[probs == 0].sum() == 0, "sampled a token pair the target gives probability zero"
    expected = probs / probs.sum() * counts.sum()
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    expected = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    nonzero = observed > 0
    g = 2 * (observed[nonzero] * torch.log(observed[nonzero] / expected[nonzero])).sum()
    df = torch.tensor(float(len(observed) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(df / 2, g / 2))


def test_g_test_pvalue_matches_the_chi_square_tail():
    counts = torch.tensor([[30.0, 20.0], [25.0, 25.0]])
    probs = torch.full((2, 2), 0.25, dtype=torch.float64)
    p = g_test_pvalue(counts, probs)
    assert 0.4 < p < 0.6  # G = 2.01 on 3 degrees of freedom: p = 0.570


@pytest.mark.parametrize("broken", [False, True], ids=["exact", "negative-control"])
def test_speculative_sampling_on_gpu_matches_target_distribution(broken, stories_gpu_fp32, perturbed_gpu_dir):
    llm = stories_gpu_fp32.with_spec(f"draft:{perturbed_gpu_dir},weights=fp32,vocab=0", 2, adaptive=False)
    if broken:
        llm.engine.processor.verifier = ResidualSkippingVerifier()
    prompt_ids = llm.tokenizer.encode("")
    pvalue = g_test_pvalue(
        sample_two_tokens(llm, prompt_ids), exact_two_token_distribution(stories_gpu_fp32, prompt_ids)
    )
    if broken:
        assert pvalue < ALPHA, f"the G-test missed a verifier that skips the residual (p={pvalue:.2e})"
    else:
        assert pvalue > ALPHA, f"speculative samples on the GPU deviate from the target (p={pvalue:.2e})"
