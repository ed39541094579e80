"""Speculative sampling is exact: with a draft that disagrees with the target, the first two generated
tokens (the second verified against a draft) follow the target's own distribution (computed by
enumeration), checked with a G-test. The same test must reject a deliberately broken verifier (negative
control), or it would prove nothing."""

import dataclasses
import random

import numpy as np
import pytest
import torch
from scipy.stats import power_divergence

from speclm import SamplingParams
from speclm.config import CacheConfig
from speclm.engine.request import Request
from speclm.sample.rejection import RejectionSampler
from speclm.sample.sampler import processed_probs
from speclm.speculative.hybrid import HybridProposer
from tests.helpers import ContiguousPass

NUM_SAMPLES = 3000
BATCH = 64  # seeded runs per engine call (batched)
ALPHA = 1e-3  # strict level: an exact sampler fails this with probability 0.001


def exact_two_token_distribution(llm, prompt_ids: list[int], params: SamplingParams) -> np.ndarray:
    """P(t1, t2) = p(t1 | prompt) * p(t2 | prompt, t1) under the processed distribution, [vocab, vocab]."""
    n = len(prompt_ids)
    passes = ContiguousPass(llm.model, n + 1)
    logits = passes.logits(prompt_ids, 0)
    p1 = processed_probs(logits[-1:], params)[0]  # [vocab]
    joint = torch.zeros(p1.shape[0], p1.shape[0], dtype=torch.float64)
    for t1 in torch.nonzero(p1).flatten().tolist():
        step_logits = passes.logits([t1], n)
        joint[t1] = p1[t1].double() * processed_probs(step_logits, params)[0].double()
    return joint.numpy()


def batched(llm):
    """`llm` on an engine of its own that runs BATCH sequences at once, each drafting at every step (a CPU
    drafts for one sequence at a time by default). Batch invariance makes each seeded run's tokens the
    ones it gets alone (test_batched_runs_are_the_runs_alone), so the samples are those of one run at a
    time, drawn faster."""
    return llm.with_engine(CacheConfig(max_num_seqs=BATCH), spec_max_batch=BATCH)


def sample_two_tokens(llm, prompt_ids: list[int], params: SamplingParams, num_samples: int) -> np.ndarray:
    """Counts of the first two tokens of seeded runs of three (the prompt's pass draws the first token; the
    third lets the step after it verify a draft for the second), BATCH runs per engine call (`llm` from
    batched()). A speculating `llm` must have drafted."""
    counts, drafted = np.zeros((llm.model.config.vocab_size,) * 2), 0
    for first in range(0, num_samples, BATCH):
        seeds = range(first, min(first + BATCH, num_samples))
        runs = [Request(str(seed), prompt_ids, three_tokens(params, seed)) for seed in seeds]
        for (out,) in llm.engine.generate(runs):
            t1, t2 = out.token_ids[:2]
            counts[t1, t2] += 1
            drafted += out.stats.drafted_tokens
    assert drafted > 0 or llm.spec is None, "no draft was verified: the test would not see the sampler"
    return counts


def three_tokens(params: SamplingParams, seed: int) -> SamplingParams:
    return dataclasses.replace(params, seed=seed, max_tokens=3, ignore_eos=True)


def g_test_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """G-test of observed cell counts against expected probabilities; cells expected < 5 are pooled."""
    expected = probs / probs.sum() * counts.sum()  # fp32 rounding leaves the enumerated total a hair off 1
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    assert counts[probs == 0].sum() == 0, "sampled a token pair the target gives probability zero"
    return power_divergence(observed, expected, lambda_="log-likelihood").pvalue


class ResidualSkippingVerifier(RejectionSampler):
    """A classic bug: after a rejection, resample from the target p instead of normalize(max(0, p - q))."""

    @staticmethod
    def residual(p, q, x):
        return p


# Settings with enough entropy in the first two tokens that a wrong verifier shows (a nearly
# deterministic prompt hides any bias). Drafts: a noisy copy, the first layer alone, one-hot n-grams.
CASES = {
    "perturbed-draft": ("draft", "", SamplingParams(temperature=1.5), 2),
    "layerskip-topk-topp": (
        "layerskip:1",
        "Once upon a time, there was a",
        SamplingParams(temperature=2.0, top_k=20, top_p=0.9),
        3,
    ),
    "draft-min-p": ("draft", "", SamplingParams(temperature=1.5, min_p=0.05), 2),
    "ngram-one-hot-drafts": (
        "ngram",
        "Tom had a red ball. Tom had a red ball. Tom had a",
        SamplingParams(temperature=1.0),
        2,
    ),
    # draft:PATH's default, the hybrid: prompt lookup where the prompt repeats itself (its first proposal
    # there), the draft model (q) elsewhere; "hybrid-coin" picks the source by a coin per step.
    "hybrid-lookup": ("draft", "Tom had a red ball. Tom had a red ball. Tom had a", SamplingParams(temperature=1.0), 2),
    "hybrid-coin": ("hybrid-coin", "Tom had a red ball. Tom had a", SamplingParams(temperature=1.5), 2),
    # a chain the draft ends itself where it is unsure (stop): proposals of varying length, set by q
    "draft-stop": ("draft,lookup=off,stop=0.9", "", SamplingParams(temperature=1.5), 2),
    "pure-draft-window": (
        "draft,lookup=off,window=3,sinks=1",
        "Tom had a red ball.",
        SamplingParams(temperature=1.5),
        2,
    ),
    # A tree of one-hot drafts: prompt lookup's branch and the Jacobi window (K is the shape's).
    "lookahead-tree": (
        "lookahead:3,2,2",
        "Tom had a red ball. Tom had a red ball. Tom had a",
        SamplingParams(temperature=1.0),
        2,
    ),
}


class CoinHybrid(HybridProposer):
    """The hybrid with its per-step choice made by a coin of its own: any choice that depends on the past
    only keeps sampling exact, the measured one included."""

    coin = random.Random(0)

    def _prefer_lookup(self, n: int, m: int, k: int) -> bool:
        self.lookup_stats.setdefault(n, self._estimator())
        return self.coin.random() < 0.5


def spec_llm(stories_llm, perturbed_stories_dir, method: str, k: int):
    """stories260K speculating with `method`, batched()."""
    if method == "hybrid-coin":
        llm = batched(stories_llm.with_spec(f"draft:{perturbed_stories_dir}", num_speculative_tokens=k, adaptive=False))
        llm.proposers._templates[llm.spec.label] = CoinHybrid(llm.proposers(llm.spec).draft)
        return llm
    spec = f"draft:{perturbed_stories_dir}{method[5:]}" if method.startswith("draft") else method
    return batched(stories_llm.with_spec(spec, num_speculative_tokens=k, adaptive=False))


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_matches_target_distribution(stories_llm, perturbed_stories_dir, case):
    method, prompt, params, k = CASES[case]
    prompt_ids = stories_llm.tokenizer.encode(prompt)
    llm = spec_llm(stories_llm, perturbed_stories_dir, method, k)
    counts = sample_two_tokens(llm, prompt_ids, params, NUM_SAMPLES)
    exact = exact_two_token_distribution(stories_llm, prompt_ids, params)
    pvalue = g_test_pvalue(counts, exact)
    assert pvalue > ALPHA, f"{case}: speculative samples deviate from the target distribution (p={pvalue:.2e})"
    if params.min_p:  # and min_p is in force: the same samples do not fit the distribution without it
        unfiltered = exact_two_token_distribution(stories_llm, prompt_ids, dataclasses.replace(params, min_p=0.0))
        assert g_test_pvalue(counts, unfiltered) < ALPHA


def test_plain_sampling_matches_target_distribution(stories_llm):
    """The same check on plain decoding, so a failure above points at speculation, not the harness."""
    params = SamplingParams(temperature=1.5)
    prompt_ids = stories_llm.tokenizer.encode("")
    counts = sample_two_tokens(batched(stories_llm), prompt_ids, params, NUM_SAMPLES)
    assert g_test_pvalue(counts, exact_two_token_distribution(stories_llm, prompt_ids, params)) > ALPHA


@pytest.mark.parametrize("method", ["draft", "layerskip:1"])
def test_negative_control_rejects_broken_verifier(stories_llm, perturbed_stories_dir, method):
    _, prompt, params, k = CASES["perturbed-draft"]
    prompt_ids = stories_llm.tokenizer.encode(prompt)
    llm = spec_llm(stories_llm, perturbed_stories_dir, method, k)
    llm.engine.processor.verifier = ResidualSkippingVerifier()
    counts = sample_two_tokens(llm, prompt_ids, params, NUM_SAMPLES)
    pvalue = g_test_pvalue(counts, exact_two_token_distribution(stories_llm, prompt_ids, params))
    assert pvalue < ALPHA, f"the test failed to detect a verifier that skips the residual (p={pvalue:.2e})"


@pytest.mark.parametrize("method", ["draft", "layerskip:1"])
def test_batched_runs_are_the_runs_alone(stories_llm, perturbed_stories_dir, method):
    """What makes batched() sampling the same as one run at a time: each seeded run in the batch gets the
    tokens, the drafts and the accepted drafts it gets alone."""
    _, prompt, params, k = CASES["perturbed-draft"]
    prompt_ids = stories_llm.tokenizer.encode(prompt)
    llm = spec_llm(stories_llm, perturbed_stories_dir, method, k)
    alone = stories_llm.with_spec(llm.spec.label, num_speculative_tokens=k, adaptive=False)
    runs = [Request(str(seed), prompt_ids, three_tokens(params, seed)) for seed in range(BATCH)]
    for run, (out,) in zip(runs, llm.engine.generate(runs)):
        expected = alone.generate(prompt_ids, run.params)[0]
        assert out.token_ids == expected.token_ids, run.request_id
        assert (out.stats.drafted_tokens, out.stats.accepted_tokens) == (
            expected.stats.drafted_tokens,
            expected.stats.accepted_tokens,
        ), run.request_id
