"""Draft heads (Medusa, EAGLE): shapes, identity init, save/load round trip, training forward."""

import pytest
import torch

from speclm.models.attention import AttentionMetadata
from speclm.models.llama import LlamaModel
from speclm.speculative.heads import EagleHead, MedusaHeads, draft_lm_head, load_head, save_head


@pytest.fixture(scope="module")
def target(stories_llm) -> LlamaModel:
    return stories_llm.model


def test_untrained_medusa_heads_are_the_identity(target):
    heads = MedusaHeads(target.config.hidden_size, target.config.vocab_size, num_heads=3)
    features = torch.randn(5, target.config.hidden_size)
    out = heads(features)
    assert out.shape == (3, 5, target.config.hidden_size)
    torch.testing.assert_close(out, features.expand(3, -1, -1), rtol=0, atol=0)


def test_token_map_restricts_the_draft_head_to_the_subset(target):
    token_map = torch.tensor([7, 3, 100])
    features = torch.randn(2, target.config.hidden_size)
    full = target.lm_head(features)
    subset = draft_lm_head(target.lm_head, token_map)(features)
    assert subset.shape == (2, 3)
    torch.testing.assert_close(subset, full[:, token_map], rtol=1e-5, atol=1e-5)
    assert draft_lm_head(target.lm_head, None) is target.lm_head
    with pytest.raises(ValueError, match="token_map"):
        MedusaHeads(
            target.config.hidden_size, target.config.vocab_size, token_map=torch.tensor([target.config.vocab_size])
        )


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_save_load_round_trip(tmp_path, target, kind):
    torch.manual_seed(0)
    token_map = torch.arange(0, 64)
    if kind == "medusa":
        head = MedusaHeads(target.config.hidden_size, target.config.vocab_size, 2, 1, token_map)
        for p in head.parameters():
            torch.nn.init.normal_(p)
    else:
        head = EagleHead(target.config, token_map)
    save_head(head, tmp_path / kind, {"note": "test"})
    loaded = load_head(tmp_path / kind, target.config)
    assert type(loaded) is type(head)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    other = target.config.__class__.from_hf_dict(
        target.config.to_hf_dict() | {"hidden_size": 8, "num_attention_heads": 2, "num_key_value_heads": 2}
    )
    with pytest.raises(ValueError, match="hidden size"):
        load_head(tmp_path / kind, other)
    with pytest.raises(ValueError, match="not a draft-head directory"):
        load_head(tmp_path)


def test_eagle_training_forward_is_causal_and_differentiable(target):
    torch.manual_seed(0)
    head = EagleHead(target.config)
    n, h = 6, target.config.hidden_size
    features, embeds = torch.randn(n, h), torch.randn(n, h)
    positions = torch.arange(1, n + 1)
    out = head(features, embeds, positions, head.new_cache(n), AttentionMetadata(0, n))
    out.square().mean().backward()
    assert head.fc.weight.grad is not None and head.fc.weight.grad.abs().sum() > 0
    # Causality: changing the last row's input leaves earlier rows unchanged.
    features2 = features.clone()
    features2[-1] += 1.0
    with torch.no_grad():
        out2 = head(features2, embeds, positions, head.new_cache(n), AttentionMetadata(0, n))
    torch.testing.assert_close(out2[:-1], out[:-1].detach(), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out2[-1], out[-1].detach())
    # Incremental rows through the cache give the same features as the full pass.
    cache = head.new_cache(n)
    with torch.no_grad():
        first = head(features[:4], embeds[:4], positions[:4], cache, AttentionMetadata(0, 4))
        rest = head(features[4:], embeds[4:], positions[4:], cache, AttentionMetadata(4, 2))
    torch.testing.assert_close(torch.cat([first, rest]), out.detach(), rtol=1e-5, atol=1e-5)
