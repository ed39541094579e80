"""Repetition, frequency and presence penalties: the function against a loop written from their definitions,
speculative greedy output == plain greedy output under them (and unlike the unpenalized output), and sampled
pairs that follow the penalized target's exact distribution (a G-test, with the unpenalized one as the
negative control)."""

import numpy as np
import pytest
import torch

from speclm import SamplingParams
from speclm.models.attention import AttentionMetadata
from speclm.sample.penalties import penalize
from speclm.sample.sampler import processed_probs
from tests.gtest import g_test
from tests.speculative.test_exactness import batched, sample_two_tokens

PENALTIES = [
    {"frequency_penalty": 1.5},
    {"presence_penalty": 2.0},
    {"repetition_penalty": 1.8},
    {"repetition_penalty": 0.7, "frequency_penalty": -0.5, "presence_penalty": 0.5},
]
PROMPTS = ["Once upon a time", "Tom and Lily went to the park. Tom", "The cat sat on the mat. The cat"]


def _reference(logits: list[float], params: SamplingParams, prompt: list[int], output: list[int]) -> list[float]:
    out = []
    for token, value in enumerate(logits):
        if token in prompt or token in output:
            rp = params.repetition_penalty
            value = value / rp if value > 0 else value * rp
        count = output.count(token)
        value -= params.frequency_penalty * count + params.presence_penalty * (count > 0)
        out.append(value)
    return out


@pytest.mark.parametrize("penalties", PENALTIES)
def test_penalize_follows_the_definitions(penalties):
    params = SamplingParams(**penalties)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 12, generator=gen) * 3
    prompt, output, paths = [1, 2], [2, 5, 5, 7], [[], [5], [5, 9]]
    got = penalize(logits, params, prompt, output, paths)
    for r in range(3):
        want = _reference(logits[r].tolist(), params, prompt, output + paths[r])
        assert got[r].tolist() == pytest.approx(want, rel=1e-6, abs=1e-6)


def test_sampling_params_refuse_out_of_range_penalties():
    for bad in ({"presence_penalty": 2.5}, {"frequency_penalty": -3}, {"repetition_penalty": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)
    assert not SamplingParams().penalized and SamplingParams(presence_penalty=0.1).penalized


@pytest.mark.parametrize("method", ["ngram", "draft"])
@pytest.mark.parametrize("penalties", PENALTIES)
def test_speculative_greedy_equals_plain_greedy_under_penalties(stories_llm, perturbed_stories_dir, method, penalties):
    spec = f"draft:{perturbed_stories_dir}" if method == "draft" else method
    llm = stories_llm.with_spec(spec, num_speculative_tokens=4, adaptive=False)
    params = SamplingParams(max_tokens=48, **penalties)
    drafted = changed = 0
    for prompt in PROMPTS:
        plain = stories_llm.generate(prompt, params)[0].token_ids
        out = llm.generate(prompt, params)[0]
        assert out.token_ids == plain, (method, penalties, prompt)
        drafted += out.stats.drafted_tokens
        changed += plain != stories_llm.generate(prompt, SamplingParams(max_tokens=48))[0].token_ids
    assert drafted > 0 or method == "ngram"  # verification ran (n-gram lookup finds little a penalty allows)
    assert changed > 0  # ... and they change the output (the test would see a penalty left out)


def _exact_pairs(llm, prompt_ids, params, penalized=True):
    """P(t1, t2) of the penalized (or, penalized=False, the unpenalized) processed distribution."""
    model, n = llm.model, len(prompt_ids)
    with torch.inference_mode():
        cache = model.new_cache(n + 1)
        hidden = model(torch.tensor(prompt_ids), torch.arange(n), cache, AttentionMetadata(0, n))
        logits = model.compute_logits(hidden[-1:])
        if penalized:
            logits = penalize(logits, params, prompt_ids, [], [[]])
        p1 = processed_probs(logits, params)[0].double()
        pairs = {}
        for t1 in torch.nonzero(p1).flatten().tolist():
            cache.truncate(n)
            h = model(torch.tensor([t1]), torch.tensor([n]), cache, AttentionMetadata(n, 1))
            logits = model.compute_logits(h)
            if penalized:
                logits = penalize(logits, params, prompt_ids, [t1], [[]])
            p2 = processed_probs(logits, params)[0].double()
            for t2 in torch.nonzero(p2).flatten().tolist():
                pairs[(t1, t2)] = float(p1[t1] * p2[t2])
    return pairs


@pytest.mark.parametrize("spec", [None, "draft"])
def test_penalized_sampling_follows_the_penalized_target(stories_llm, perturbed_stories_dir, spec):
    """A G-test of two sampled tokens under strong repetition and frequency penalties against the penalized
    target's exact distribution (passes) and against the unpenalized one (the negative control: fails)."""
    params = SamplingParams(
        temperature=1.0, top_k=4, max_tokens=3, ignore_eos=True, repetition_penalty=3.0, frequency_penalty=2.0
    )
    draft = f"draft:{perturbed_stories_dir},lookup=off"
    llm = batched(stories_llm if spec is None else stories_llm.with_spec(draft, 2, adaptive=False))
    prompt_ids = stories_llm.encode("The cat sat on the mat. The cat")
    exact = _exact_pairs(stories_llm, prompt_ids, params)
    wrong = _exact_pairs(stories_llm, prompt_ids, params, penalized=False)
    samples = 1500
    pair_counts = sample_two_tokens(llm, prompt_ids, params, samples)  # (asserts that a draft was verified)
    counts = {(int(t1), int(t2)): int(pair_counts[t1, t2]) for t1, t2 in zip(*np.nonzero(pair_counts))}
    assert g_test(counts, exact, samples) > 1e-3
    assert g_test(counts, wrong, samples) < 1e-3
