"""Speculative decoding on the GPU returns plain decoding's greedy tokens for every proposer that needs no
trained head (draft:'s hybrid with prompt lookup included), batched and alone; and a batch's outputs equal
each request run alone (concurrency)."""

from __future__ import annotations

import pytest

from speclm import SamplingParams
from tests.cuda.conftest import PROMPTS, needs_cuda

pytestmark = needs_cuda

GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)
METHODS = {
    "ngram": "ngram",
    "lookahead": "lookahead:3,2,2",
    "layerskip": "layerskip:2",
    # a draft that disagrees, so rejections happen too (lookup=off: the draft model alone)
    "draft": "draft:{perturbed},weights=fp32,vocab=0,lookup=off",
    "draft-tree": "draft:{perturbed},weights=fp32,vocab=0,branch=0.9,lookup=off",
    "draft-token-map": "draft:{perturbed},vocab=300,lookup=off",  # the GPU's default draft format, 300-token head
    "draft-hybrid": "draft:{perturbed},weights=fp32,vocab=0",  # draft:'s default: prompt lookup or the draft
}


def outputs(llm, prompts=PROMPTS) -> list[list[int]]:
    return [o.token_ids for o in llm.generate(prompts, GREEDY)]


@pytest.mark.parametrize("method", list(METHODS))
@pytest.mark.parametrize("precision", ["fp32", "half"])
def test_speculative_equals_plain_greedy_on_gpu(method, precision, stories_gpu_fp32, stories_gpu, perturbed_gpu_dir):
    llm = stories_gpu_fp32 if precision == "fp32" else stories_gpu
    spec = METHODS[method].format(perturbed=perturbed_gpu_dir)
    expected = outputs(llm)
    spec_llm = llm.with_spec(spec, num_speculative_tokens=4, adaptive=False)
    assert outputs(spec_llm) == expected


@pytest.mark.parametrize("precision", ["fp32", "half"])
def test_32_concurrent_requests_get_their_solo_outputs_on_gpu(precision, stories_gpu_fp32, stories_gpu):
    llm = stories_gpu_fp32 if precision == "fp32" else stories_gpu
    prompts = [f"{PROMPTS[i % len(PROMPTS)]} {'and ' * (i % 5)}".strip() for i in range(32)]
    together = outputs(llm, prompts)
    alone = [outputs(llm, [p])[0] for p in prompts]
    mismatches = sum(a != b for a, b in zip(together, alone))
    assert mismatches == 0, f"{mismatches}/32 requests differ between the batch and running alone"


def test_a_prefix_cache_hit_leaves_half_precision_output_unchanged(stories_gpu):
    """The second run of the same prompts reads their prompt blocks from the prefix cache, so only the
    prompts' tail rows are computed: with batch-invariant attention they round as they did the first time."""
    fresh = stories_gpu.with_engine()
    first = outputs(fresh)
    assert outputs(fresh) == first
