"""Tree speculative sampling is exact: with a depth-2 tree (3 siblings, 2 children each) drawn from a
draft distribution that disagrees with the target, the first two generated tokens follow the target's
exact distribution (G-test) — for sampled siblings with draft probabilities (recursive rejection
against a residual) and for deterministic top-k siblings, with top-k/top-p on. A broken sibling
scheme (no residual update after a sibling fails) must be rejected by the same test.

One case runs the whole engine (tree pass, KV commit, next step); the others drive the verifier with
the target's logits precomputed for every first token, which is the same computation ~30x faster."""

import dataclasses

import pytest
import torch

from speclm import SamplingParams
from speclm.sample.rejection import RejectionSampler
from speclm.sample.row_logits import RowLogits
from speclm.sample.sampler import processed_probs, sample_from_probs
from speclm.sample.tree import TokenTree
from tests.helpers import ContiguousPass, engine_with_proposer, generate_with_proposer
from tests.speculative.test_exactness import ALPHA, NUM_SAMPLES, exact_two_token_distribution, g_test_pvalue
from tests.speculative.tree_proposers import TableTreeProposer

CASES = {
    "sampled-siblings": ("", SamplingParams(temperature=1.5), "sampled"),
    "sampled-siblings-topk-topp": (
        "Once upon a time, there was a",
        SamplingParams(temperature=2.0, top_k=20, top_p=0.9),
        "sampled",
    ),
    "topk-siblings-topk-topp": (
        "Once upon a time, there was a",
        SamplingParams(temperature=2.0, top_k=20, top_p=0.9),
        "topk",
    ),
}


def draft_tables(llm, prompt_ids, params):
    """Draft distributions that disagree with the target: its processed p flattened (square root)
    and mixed with a little uniform mass (so q > 0 where p = 0). q1 at the prompt, q2[x] after x."""
    n = len(prompt_ids)
    passes = ContiguousPass(llm.model, n + 1)
    logits = passes.logits(prompt_ids, 0)

    def disagree(logits_row):
        p = processed_probs(logits_row, params)[0].sqrt()
        q = 0.9 * p / p.sum() + 0.1 / p.numel()
        return q / q.sum()

    q1 = disagree(logits[-1:])
    q2, after = {}, torch.zeros(q1.numel(), q1.numel())  # after[x] = target logits after prompt + x
    for x in range(q1.numel()):
        step = passes.logits([x], n)
        q2[x], after[x] = disagree(step), step[0]
    return q1, q2, logits[-1], after


def sample_first_two(llm, proposer, prompt_ids, params, verifier=None):
    engine = engine_with_proposer(llm, proposer, 16)
    if verifier is not None:
        engine.processor.verifier = verifier
    counts = torch.zeros((llm.model.config.vocab_size,) * 2, dtype=torch.float64)
    deep = 0
    for seed in range(NUM_SAMPLES):
        run = dataclasses.replace(params, seed=seed, max_tokens=3, ignore_eos=True)
        out = generate_with_proposer(llm, proposer, prompt_ids, run, 16, engine=engine)
        t1, t2 = out.token_ids[:2]
        counts[t1, t2] += 1
        deep += out.stats.accepted_per_position[1] if len(out.stats.accepted_per_position) > 1 else 0
    return counts.numpy(), deep


def verify_first_two(proposer, root_logits, after, prompt_len, params, verifier=None):
    """The engine's first two tokens without the model: the tree's rows get the target logits at the
    prompt (root) and after each first token (depth-1 nodes; depth-2 rows only feed the third token,
    which is not counted). A recovered first token is followed by a plain draw, as the engine does."""
    verifier = verifier or RejectionSampler()
    generator = torch.Generator().manual_seed(0)
    vocab = after.shape[0]
    counts, deep = torch.zeros(vocab, vocab, dtype=torch.float64), 0
    for _ in range(NUM_SAMPLES):
        proposal = proposer.propose([0] * prompt_len, 16, params, generator)
        tree = TokenTree(tuple(proposal.parents))
        depths = tree.depths()
        rows = [root_logits] + [after[t] if depths[i + 1] == 1 else root_logits for i, t in enumerate(proposal.tokens)]
        logits = RowLogits.computed(torch.stack(rows))  # [1 + num_nodes, vocab]
        result = verifier.verify(logits, tree, proposal.tokens, proposal.probs, params, generator)
        t1 = result.tokens[0]
        t2 = (
            result.tokens[1]
            if len(result.tokens) > 1
            else int(sample_from_probs(processed_probs(after[t1 : t1 + 1], params), generator))
        )
        counts[t1, t2] += 1
        deep += result.num_accepted == 2
    return counts.numpy(), deep


class NoResidualUpdate(RejectionSampler):
    """A broken sibling scheme: a failed sibling leaves the running distribution as it was."""

    @staticmethod
    def residual(p, q, x):
        return p


@pytest.fixture(scope="module")
def tables(stories_llm):
    made = {}
    for prompt, params, _ in CASES.values():
        if (prompt, repr(params)) not in made:
            made[prompt, repr(params)] = draft_tables(stories_llm, stories_llm.tokenizer.encode(prompt), params)
    return {case: made[prompt, repr(params)] for case, (prompt, params, _) in CASES.items()}


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("case", list(CASES))
def test_tree_sampling_matches_target_distribution(stories_llm, tables, case):
    prompt, params, mode = CASES[case]
    prompt_ids = stories_llm.tokenizer.encode(prompt)
    q1, q2, root_logits, after = tables[case]
    proposer = TableTreeProposer(len(prompt_ids), q1, q2, mode)
    if case == "sampled-siblings":
        counts, deep = sample_first_two(stories_llm, proposer, prompt_ids, params)
    else:
        counts, deep = verify_first_two(proposer, root_logits, after, len(prompt_ids), params)
    assert deep > NUM_SAMPLES // 20, "depth-2 nodes were rarely accepted; the test would not see a bias there"
    pvalue = g_test_pvalue(counts, exact_two_token_distribution(stories_llm, prompt_ids, params))
    assert pvalue > ALPHA, f"{case}: tree samples deviate from the target distribution (p={pvalue:.2e})"


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("case", ["sampled-siblings", "topk-siblings-topk-topp"])
def test_negative_control_rejects_broken_sibling_scheme(stories_llm, tables, case):
    prompt, params, mode = CASES[case]
    prompt_ids = stories_llm.tokenizer.encode(prompt)
    q1, q2, root_logits, after = tables[case]
    proposer = TableTreeProposer(len(prompt_ids), q1, q2, mode)
    counts, _ = verify_first_two(proposer, root_logits, after, len(prompt_ids), params, NoResidualUpdate())
    pvalue = g_test_pvalue(counts, exact_two_token_distribution(stories_llm, prompt_ids, params))
    assert pvalue < ALPHA, f"{case}: the test failed to detect a broken sibling scheme (p={pvalue:.2e})"
