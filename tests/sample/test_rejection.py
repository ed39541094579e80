"""RejectionSampler on synthetic tensors, through the call the engine makes (verify over RowLogits):
accepted / recovered / bonus semantics and exactness."""

import pytest
import torch
from scipy.stats import chisquare

from speclm.sample.rejection import RejectionSampler
from speclm.sample.row_logits import RowLogits
from speclm.sample.sampler import processed_probs
from speclm.sample.tree import TokenTree
from speclm.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
PLAIN = SamplingParams(temperature=1.0)  # processed p = softmax(logits): logits log(p) give back p


def verify_chain(logits, drafts, q, params, generator=None, sampler=None):
    """A chain of drafts verified as the engine does: rows of logits [K+1, vocab] computed by the forward."""
    rows = RowLogits.computed(logits)
    return (sampler or RejectionSampler()).verify(rows, TokenTree.chain(len(drafts)), drafts, q, params, generator)


def verify_probs(p, drafts, q, generator):
    """A chain against target probabilities p [K+1, vocab] (given as logits log p, temperature 1)."""
    return verify_chain(p.log(), drafts, q, PLAIN, generator)


def logits_preferring(tokens: list[int], vocab: int = 8) -> torch.Tensor:
    """Rows of logits whose argmax is the given token."""
    x = torch.zeros(len(tokens), vocab)
    x[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return x


def test_greedy_perfect_match_accepts_all_and_adds_bonus():
    result = verify_chain(logits_preferring([3, 1, 4, 6]), [3, 1, 4], None, GREEDY)
    assert result.tokens == [3, 1, 4, 6]
    assert result.num_accepted == 3 and result.bonus


def test_greedy_early_mismatch_keeps_prefix_and_recovers_target_choice():
    result = verify_chain(logits_preferring([3, 2, 4, 6]), [3, 1, 4], None, GREEDY)
    assert result.tokens == [3, 2]
    assert result.num_accepted == 1 and not result.bonus


def test_greedy_first_token_rejected():
    result = verify_chain(logits_preferring([5, 1]), [3], None, GREEDY)
    assert result.tokens == [5] and result.num_accepted == 0


def test_no_drafts_is_plain_decoding():
    result = verify_chain(logits_preferring([7]), [], None, GREEDY)
    assert result.tokens == [7] and result.num_accepted == 0 and not result.bonus


def test_sampled_identical_distributions_always_accept():
    p = torch.softmax(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)), -1)
    g = torch.Generator().manual_seed(1)
    q = processed_probs(p.log()[:3], PLAIN)  # the draft's q is the target's own p, bit for bit
    for _ in range(200):
        result = verify_probs(p, [0, 1, 2], q, g)
        assert result.num_accepted == 3 and result.bonus and len(result.tokens) == 4


def test_draft_zero_probability_where_target_positive_goes_to_residual():
    # Target is 50/50 over tokens 0 and 1; the draft always says 0 (q(1) = 0).
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[1.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    outcomes = {"accepted": 0, "recovered_1": 0}
    n = 4000
    for _ in range(n):
        result = verify_probs(p, [0], q, g)
        if result.num_accepted == 1:
            outcomes["accepted"] += 1
        else:
            assert result.tokens == [1], "the residual max(0, p - q) puts all mass on token 1"
            outcomes["recovered_1"] += 1
    assert abs(outcomes["accepted"] / n - 0.5) < 0.04


def test_one_hot_drafts_equal_explicit_one_hot_probabilities():
    p = torch.softmax(torch.randn(2, 6, generator=torch.Generator().manual_seed(3)), -1)
    one_hot = torch.nn.functional.one_hot(torch.tensor([2]), 6).float()
    a = [verify_probs(p, [2], None, torch.Generator().manual_seed(s)).tokens for s in range(300)]
    b = [verify_probs(p, [2], one_hot, torch.Generator().manual_seed(s)).tokens for s in range(300)]
    assert a == b


@pytest.mark.parametrize("k", [1, 2, 3])
def test_first_output_token_is_distributed_as_target(k):
    """Exactness of one verification step, by enumeration: the first committed token (accepted draft
    or recovered) must follow p[0] exactly, whatever the draft distribution q is."""
    vocab, n = 5, 20000
    gen = torch.Generator().manual_seed(k)
    p = torch.softmax(torch.randn(k + 1, vocab, generator=gen) * 1.5, -1)
    q = torch.softmax(torch.randn(k, vocab, generator=gen) * 1.5, -1)
    counts = torch.zeros(vocab)
    sampler = RejectionSampler()
    for _ in range(n):
        drafts = torch.multinomial(q, 1, generator=gen).squeeze(-1).tolist()
        counts[verify_chain(p.log(), drafts, q, PLAIN, gen, sampler).tokens[0]] += 1
    assert chisquare(counts.numpy(), (p[0] * n).numpy()).pvalue > 1e-3


def test_verify_uses_processed_distribution_with_top_k():
    # With top_k=1 sampling collapses to greedy: the bonus token must be the argmax.
    params = SamplingParams(temperature=1.0, top_k=1)
    logits = logits_preferring([3, 1])
    q = processed_probs(logits[:1], params)
    result = verify_chain(logits, [3], q, params, torch.Generator().manual_seed(0))
    assert result.tokens == [3, 1]


def test_min_p_drops_tokens_below_its_share_of_the_likeliest():
    p = torch.tensor([[0.5, 0.3, 0.12, 0.06, 0.02]])
    kept = processed_probs(p.log(), SamplingParams(temperature=1.0, min_p=0.1))  # threshold 0.05
    assert torch.allclose(kept, torch.tensor([[0.5, 0.3, 0.12, 0.06, 0.0]]) / 0.98)
    assert torch.equal(processed_probs(p.log(), SamplingParams(temperature=1.0, min_p=1.0)), torch.eye(5)[:1])
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=1.5)


@pytest.mark.parametrize("params", [GREEDY, SamplingParams(temperature=0.8, top_k=5)])
def test_rows_on_demand_verify_like_computed_rows(params):
    """A big tree's rows computed one at a time on demand give the walk the same tokens, and only the
    rows on its path are computed."""
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 8, generator=gen)
    tree, drafts = TokenTree((-1, -1, 0, 0, 2)), [1, 2, 3, 4, 5]
    asked = []

    def compute_row(row):
        asked.append(row)
        return logits[row]

    for seed in range(20):
        lazy = RowLogits.on_demand(compute_row)
        a = RejectionSampler().verify(lazy, tree, drafts, None, params, torch.Generator().manual_seed(seed))
        b = RejectionSampler().verify(
            RowLogits.computed(logits), tree, drafts, None, params, torch.Generator().manual_seed(seed)
        )
        assert a == b
        assert set(asked) <= {0, *(i + 1 for i in a.path)} and lazy.seconds > 0
        asked.clear()
