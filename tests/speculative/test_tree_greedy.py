"""Tree speculation is lossless under greedy: the true continuation hidden at random depths and sibling
positions among distractors is found, and the output equals plain greedy token for token, in fp32 and
in bf16 (where a verification row computed differently from plain decoding flips near-ties)."""

import pytest

from speclm import LLM, SamplingParams
from speclm.sample.tree import TokenTree
from speclm.speculative.proposer import Proposal
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER
from tests.helpers import generate_with_proposer
from tests.speculative.tree_proposers import OracleTreeProposer

PROMPTS = ["", "Once upon a time", "Tom and Lily went to the park. Tom", "One day, a little bird"]
PARAMS = SamplingParams(max_tokens=48, ignore_eos=True)


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def llm_and_reference(request, stories_llm):
    llm = stories_llm if request.param == "fp32" else LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, weights="bf16")
    reference = {}
    for p in PROMPTS:
        ids = llm.tokenizer.encode(p)
        reference[p] = ids + llm.generate(ids, PARAMS)[0].token_ids
    return llm, reference


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16])
def test_tree_speculation_greedy_equals_plain_greedy(llm_and_reference, k):
    llm, reference = llm_and_reference
    accepted_deep = 0
    for i, prompt in enumerate(PROMPTS):
        ids = llm.tokenizer.encode(prompt)
        proposer = OracleTreeProposer(reference[prompt], llm.model.config.vocab_size, seed=100 * k + i)
        out = generate_with_proposer(llm, proposer, ids, PARAMS, k)
        assert ids + out.token_ids == reference[prompt], (k, prompt)
        accepted_deep += sum(a >= 3 for a in proposer.accepted)
        # the first token comes from the prompt's pass (a one-token prompt's pass counts as a decoding step)
        assert out.stats.decode_tokens == len(out.token_ids) - (len(ids) > 1)
    if k >= 4:
        assert accepted_deep > 0  # deep paths were really accepted


def test_limit_depth_keeps_a_parents_first_tree():
    p = Proposal([10, 11, 12, 13, 14], None, [-1, 0, -1, 1, 2])  # depths 1 2 1 3 2
    cut = p.limited_to_depth(2)
    assert cut.tokens == [10, 11, 12, 14] and cut.parents == [-1, 0, -1, 2]
    assert TokenTree(tuple(cut.parents)).depths() == [0, 1, 2, 1, 2]
    assert TokenTree((-1, 0, 0, 1)).row_paths() == [[0], [0, 1], [0, 1, 2], [0, 1, 3], [0, 1, 2, 4]]


@pytest.mark.slow
def test_default_model_int4_tree_speculation_greedy_equals_plain_greedy(specbench_prompts):
    """SmolLM2 with int4 weights (bf16 activations): tree rows must attend exactly like decoding.
    One tree-masked SDPA call per layer instead diverged from plain greedy on 7 of 12 such runs
    (measured); the per-row decoding-shaped attention matches on all."""
    from tests.speculative.test_greedy_equality import default_model_prompts

    llm = LLM(weights="int4")
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    for i, ids in enumerate(default_model_prompts(specbench_prompts, llm.tokenizer, count=4, max_prompt_tokens=120)):
        reference = ids + llm.generate(ids, params)[0].token_ids
        k = (4, 16)[i % 2]
        proposer = OracleTreeProposer(reference, llm.model.config.vocab_size, seed=10 * i + k)
        out = generate_with_proposer(llm, proposer, ids, params, k)
        assert ids + out.token_ids == reference, (i, k)
        assert max(proposer.accepted) >= 3  # deep paths were accepted
