"""Grammar masks in sampling and verification, on synthetic tensors: masks come before top-k/top-p,
sampled tokens follow the masked distribution (G-test, with negative controls), the rejection sampler
with masked target and draft distributions commits tokens distributed as the masked target, and the
reported logprobs are the masked, renormalized temperature-1 distribution."""

import numpy as np
import pytest
import torch

from speclm.sample.masked import (
    additive_mask,
    logprobs_of,
    mask_logits,
    masked_probs,
    masked_target_logits,
    select_masked,
    token_logprobs,
)
from speclm.sample.sampler import processed_probs
from speclm.sampling_params import SamplingParams
from tests.sample.test_rejection import verify_chain, verify_probs
from tests.speculative.test_exactness import g_test_pvalue

ALPHA = 1e-3
LOGITS = torch.tensor([[5.0, 4.0, 3.0, 2.0, 1.0, 0.0]])
MASK = torch.tensor([[False, True, True, False, True, True]])  # the best token is outside the grammar


def test_mask_logits_and_additive_mask():
    masked = mask_logits(LOGITS, MASK)
    assert torch.isinf(masked[~MASK]).all() and torch.equal(masked[MASK], LOGITS[MASK])
    assert torch.equal(LOGITS + additive_mask(MASK), masked)
    assert mask_logits(LOGITS, None) is LOGITS
    with pytest.raises(ValueError, match="mask covers 5 tokens"):
        mask_logits(LOGITS, MASK[:, :5])


def test_greedy_picks_the_best_allowed_token():
    greedy = SamplingParams(temperature=0.0)
    assert select_masked(LOGITS, greedy, MASK, None).tolist() == [1]
    assert masked_probs(LOGITS, greedy, MASK).argmax(-1).tolist() == [1]


def test_mask_comes_before_top_k_and_top_p():
    """top_k=2 keeps the two best *allowed* tokens (1 and 2); masking after top-k would keep only 1."""
    probs = masked_probs(LOGITS, SamplingParams(temperature=1.0, top_k=2), MASK)[0]
    assert (probs > 0).nonzero().flatten().tolist() == [1, 2]
    assert torch.allclose(probs[1:3], torch.softmax(torch.tensor([4.0, 3.0]), -1))
    probs = masked_probs(LOGITS, SamplingParams(temperature=1.0, top_p=0.8), MASK)[0]
    allowed = torch.softmax(torch.tensor([4.0, 3.0, 1.0, 0.0]), -1)  # 0.64, 0.24, ...: tokens 1, 2 make 0.8
    assert (probs > 0).nonzero().flatten().tolist() == [1, 2]
    assert torch.allclose(probs[1:3], allowed[:2] / allowed[:2].sum())


def random_case(seed: int, vocab: int = 12):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, vocab, generator=gen) * 1.5
    mask = torch.rand(1, vocab, generator=gen) < 0.6
    mask[0, int(logits.argmax())] = False  # the model's favourite is outside the grammar
    mask[0, :2] = True
    return logits, mask, gen


def test_sampled_tokens_follow_the_masked_distribution():
    """G-test of 20000 draws at temperature 0.8 with top_k=4 under a mask; negative controls: the same
    draws against the mask-after-top-k distribution, and unmasked draws against the masked one."""
    logits, mask, gen = random_case(0)
    params = SamplingParams(temperature=0.8, top_k=4)
    n = 20000
    draws = torch.stack([select_masked(logits.expand(n, -1), params, mask, gen)]).flatten()
    counts = np.bincount(draws.numpy(), minlength=logits.shape[-1]).astype(float)
    assert counts[~mask[0].numpy()].sum() == 0
    exact = masked_probs(logits, params, mask)[0].double().numpy()
    assert g_test_pvalue(counts, exact) > ALPHA
    # Negative control 1: top-k first, then the mask (what a sampler that masks too late draws).
    late = processed_probs(logits, params)[0] * mask[0]
    late = (late / late.sum()).double().numpy()
    assert not np.allclose(late, exact)
    ok = counts[late == 0].sum() == 0 and g_test_pvalue(counts, late) > ALPHA
    assert not ok
    # Negative control 2: a sampler that ignores the mask fails the test against the masked distribution.
    free = torch.multinomial(processed_probs(logits, params)[0], n, replacement=True, generator=gen)
    free_counts = np.bincount(free.numpy(), minlength=logits.shape[-1]).astype(float)
    with pytest.raises(AssertionError, match="probability zero"):
        g_test_pvalue(free_counts, exact)


@pytest.mark.parametrize("drafted", [True, False])
def test_verification_under_a_mask_commits_the_masked_target(drafted):
    """One chain step with masked target rows and drafts from the masked draft distribution (or
    deterministic drafts, some outside the grammar): the first committed token follows the masked
    target exactly. Negative control: verifying against the unmasked target does not."""
    vocab, k, n = 10, 2, 12000
    gen = torch.Generator().manual_seed(3)
    target = torch.randn(k + 1, vocab, generator=gen) * 1.5  # [k + 1, vocab]
    draft = torch.randn(k, vocab, generator=gen) * 1.5  # [k, vocab]
    masks = torch.rand(k + 1, vocab, generator=gen) < 0.5  # [k + 1, vocab]: the grammar at each row
    masks[:, :3] = True
    params = SamplingParams(temperature=1.0)
    p = masked_probs(target, params, masks)  # [k + 1, vocab]
    q = masked_probs(draft, params, masks[:k])  # the draft model samples inside the grammar
    outside = int((~masks[0]).nonzero()[0])
    counts, wrong_counts = np.zeros(vocab), np.zeros(vocab)
    unmasked = processed_probs(target, params)
    for _ in range(n):
        if drafted:
            drafts = torch.multinomial(q, 1, generator=gen).flatten().tolist()
            probs = q
        else:  # n-gram-like drafts, the first outside the grammar
            drafts, probs = [outside, 1], None
        counts[verify_probs(p, drafts, probs, gen).tokens[0]] += 1
        wrong_counts[verify_probs(unmasked, drafts, probs, gen).tokens[0]] += 1
    assert g_test_pvalue(counts, p[0].double().numpy()) > ALPHA
    assert counts[outside] == 0
    assert wrong_counts[~masks[0].numpy()].sum() > 0  # the negative control leaves the grammar


def test_masked_target_logits_verify_greedy_inside_the_grammar():
    """Greedy verification on masked rows: a draft the grammar rejects is never accepted, even when it
    is the unmasked argmax; the recovered token is the best allowed one."""
    target = torch.tensor([[0.0, 9.0, 5.0, 1.0], [0.0, 1.0, 2.0, 9.0]])
    masks = torch.tensor([[True, False, True, True], [True, True, True, True]])
    greedy = SamplingParams(temperature=0.0)
    result = verify_chain(masked_target_logits(target, masks), [1], None, greedy)
    assert result.tokens == [2] and result.num_accepted == 0
    result = verify_chain(masked_target_logits(target, masks), [2], None, greedy)
    assert result.tokens == [2, 3] and result.bonus


def test_token_logprobs_report_the_masked_renormalized_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 3.0], [0.0, 1.0, 2.0, 3.0]])
    mask = torch.tensor([[True, True, True, False], [False, False, True, False]])
    out = token_logprobs(logits, [0, 2], top_n=3, mask=mask)
    expected = torch.log_softmax(torch.tensor([2.0, 1.0, 0.5]), -1)
    chosen, top = out[0]
    assert chosen == pytest.approx(float(expected[0]))
    assert [t for t, _ in top] == [0, 1, 2] and [v for _, v in top] == pytest.approx(expected.tolist())
    assert out[1] == (0.0, [(2, 0.0)])  # one allowed token: probability 1, listed alone
    assert token_logprobs(logits, [3, 2], top_n=0, mask=mask)[0] == (float("-inf"), [])
    # Without a mask: the model's temperature-1 distribution, whatever the sampling settings.
    assert torch.allclose(logprobs_of(logits), torch.log_softmax(logits, -1))
