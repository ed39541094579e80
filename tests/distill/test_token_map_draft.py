"""A draft whose head covers only a token subset (speclm_token_map.json) keeps speculation exact."""

import json
import os

import pytest
import torch

from speclm import SamplingParams
from speclm.models import load_checkpoint
from speclm.speculative.draft_model import TOKEN_MAP_FILE, DraftModelProposer, load_token_map
from tests.conftest import STORIES_MODEL
from tests.speculative.conftest import write_hf_dir
from tests.speculative.test_exactness import (
    ALPHA,
    batched,
    exact_two_token_distribution,
    g_test_pvalue,
    sample_two_tokens,
)
from tests.speculative.test_greedy_equality import STORY_PROMPTS


@pytest.fixture(scope="module")
def token_map_draft_dir(tmp_path_factory, stories_llm):
    """stories260K itself as the draft, its head restricted to a random half of the vocabulary: it
    agrees with the target exactly when the target's token is in the map, so drafts are accepted
    and rejected, and its q (renormalized over the map) differs from the target's p."""
    path = write_hf_dir(load_checkpoint(STORIES_MODEL), str(tmp_path_factory.mktemp("token_map_draft")))
    vocab = stories_llm.model.config.vocab_size
    ids = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[: vocab // 2].tolist()
    with open(os.path.join(path, TOKEN_MAP_FILE), "w") as f:
        json.dump(sorted(ids), f)
    return path


def test_token_map_draft_greedy_equals_plain_greedy(stories_llm, token_map_draft_dir):
    token_map = set(load_token_map(token_map_draft_dir, 512).tolist())
    params = SamplingParams(max_tokens=48)
    expected = {prompt: stories_llm.generate(prompt, params)[0].token_ids for prompt in STORY_PROMPTS}
    for k in (1, 4):
        llm = stories_llm.with_spec(f"draft:{token_map_draft_dir},lookup=off", num_speculative_tokens=k, adaptive=False)
        proposer = llm.proposers(llm.spec)  # a fresh proposer for one sequence
        assert isinstance(proposer, DraftModelProposer) and proposer.head.token_map is not None
        drafted = accepted = 0
        for prompt in STORY_PROMPTS:
            out = llm.generate(prompt, params)[0]
            assert out.token_ids == expected[prompt], (k, prompt)
            drafted += out.stats.drafted_tokens
            accepted += out.stats.accepted_tokens
        assert drafted > 0 and 0 < accepted < drafted
    # proposals stay inside the map and the context's tokens, and their q is zero outside them
    ids = stories_llm.tokenizer.encode("Once upon a time")
    proposer.start(ids, 64)
    proposal = proposer.propose(ids, 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(1))
    assert not set(ids) <= token_map  # (so the context adds columns)
    assert set(proposer.head.columns.tolist()) == token_map | set(ids)
    assert set(proposal.tokens) <= token_map | set(ids)
    outside = torch.ones(512, dtype=torch.bool)
    outside[list(token_map | set(ids))] = False
    assert proposal.probs[:, outside].sum() == 0
    torch.testing.assert_close(proposal.probs.sum(-1), torch.ones(4))


def test_token_map_draft_sampling_matches_target_distribution(stories_llm, token_map_draft_dir):
    params = SamplingParams(temperature=1.5)
    prompt_ids = stories_llm.tokenizer.encode("")
    llm = batched(stories_llm.with_spec(f"draft:{token_map_draft_dir}", num_speculative_tokens=2, adaptive=False))
    counts = sample_two_tokens(llm, prompt_ids, params, 1000)  # fewer than the spec suite: CI time
    pvalue = g_test_pvalue(counts, exact_two_token_distribution(stories_llm, prompt_ids, params))
    assert pvalue > ALPHA, f"token-map draft samples deviate from the target distribution (p={pvalue:.2e})"


def test_bad_token_map_is_a_value_error(tmp_path):
    (tmp_path / TOKEN_MAP_FILE).write_text("[1, 2, 9999]")
    with pytest.raises(ValueError, match="token ids"):
        load_token_map(str(tmp_path), 512)
    assert load_token_map(str(tmp_path / "missing"), 512) is None
