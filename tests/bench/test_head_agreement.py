"""The head-agreement benchmark (benchmarks/head_agreement/) scores each response row against the target's
own next token."""

import torch

from speclm.distill.data import TargetData
from speclm.speculative.heads import EagleHead
from tests.helpers import load_benchmark

first_draft_agreement = load_benchmark("head_agreement").first_draft_agreement


class OracleHead(EagleHead):
    """Predicts the true next feature of `truth` (the one sequence scored): agrees wherever its token map allows."""

    truth: torch.Tensor

    def forward(self, features, next_embeds, positions, cache, meta):
        return self.truth[1 : 1 + features.shape[0]]


def _one_sequence(config, n=12, prompt_len=4):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(config.vocab_size, (n,), generator=g)
    features = torch.randn(n, config.hidden_size, generator=g)
    data = TargetData(
        tokens,
        features.bfloat16(),
        torch.tensor([0, n]),
        torch.tensor([prompt_len]),
        torch.zeros(config.vocab_size, dtype=torch.long),
    )
    return data, features


def test_an_oracle_head_agrees_on_every_response_row(stories_llm):
    config = stories_llm.model.config
    data, _ = _one_sequence(config)
    head = OracleHead(config)
    head.truth = data.sequence(0)[1]
    output_head = torch.randn(config.vocab_size, config.hidden_size, generator=torch.Generator().manual_seed(1))
    result = first_draft_agreement(head, output_head, output_head, data, ["qa"])
    # Rows t = 2..9 predict response tokens 4..11 (the first response token is the target's own pass).
    assert result["qa"] == {"rows": 8, "agreement": 1.0, "coverage": 1.0}
    assert result["overall"] == result["qa"]


def test_agreement_is_capped_by_the_token_map(stories_llm):
    config = stories_llm.model.config
    data, _ = _one_sequence(config)
    output_head = torch.randn(config.vocab_size, config.hidden_size, generator=torch.Generator().manual_seed(1))
    features = data.sequence(0)[1]
    targets = (features[3:11] @ output_head.T).argmax(-1)  # the target's tokens 4..11
    token_map = torch.tensor(sorted(set(targets[:5].tolist()) | {0}))  # covers some of them only
    head = OracleHead(config, token_map=token_map)
    head.truth = features
    result = first_draft_agreement(head, output_head, output_head, data, ["qa"])["qa"]
    coverage = float(torch.isin(targets, token_map).float().mean())
    assert 0 < coverage < 1
    assert result["coverage"] == coverage and result["agreement"] == coverage
