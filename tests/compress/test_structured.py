"""Structured pruning shrinks the tensors and equals masking the removed units in the original model."""

import pytest
import torch

from speclm.compress.model_io import load_with_tokenizer, rebuild
from speclm.compress.structured import prune_structured
from tests.compress.test_checkpoint_io import PROMPT_IDS, logits_of
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER


@pytest.fixture(scope="module")
def stories():
    return load_with_tokenizer(STORIES_MODEL, STORIES_TOKENIZER)[0]


def kept_rows(small: torch.Tensor, big: torch.Tensor) -> list[int]:
    return [int((big == row).all(dim=1).nonzero()[0]) for row in small]


def test_mlp_channel_pruning_equals_zeroing_those_channels(stories):
    pruned = prune_structured(stories, rebuild(stories), "mlp-channels", 0.25)
    assert pruned.config.intermediate_size == 172 - 43
    masked = {k: v.clone() for k, v in stories.tensors.items()}
    for i in range(stories.config.num_layers):
        p = f"model.layers.{i}.mlp."
        keep = kept_rows(pruned.tensors[p + "gate_proj.weight"], stories.tensors[p + "gate_proj.weight"])
        drop = sorted(set(range(172)) - set(keep))
        masked[p + "down_proj.weight"][:, drop] = 0
    reference = type(stories)(stories.config, masked, stories.source)
    torch.testing.assert_close(
        logits_of(rebuild(pruned), PROMPT_IDS), logits_of(rebuild(reference), PROMPT_IDS), rtol=1e-4, atol=1e-4
    )


def test_attention_group_pruning_equals_zeroing_those_heads(stories):
    c = stories.config
    pruned = prune_structured(stories, rebuild(stories), "attention-heads", 0.5)
    assert (pruned.config.num_heads, pruned.config.num_kv_heads) == (c.num_heads // 2, c.num_kv_heads // 2)
    assert pruned.tensors["model.layers.0.self_attn.k_proj.weight"].shape == (
        c.num_kv_heads // 2 * c.head_dim,
        c.hidden_size,
    )
    masked = {k: v.clone() for k, v in stories.tensors.items()}
    for i in range(c.num_layers):
        p = f"model.layers.{i}.self_attn."
        keep = kept_rows(pruned.tensors[p + "q_proj.weight"], stories.tensors[p + "q_proj.weight"])
        drop = sorted(set(range(c.num_heads * c.head_dim)) - set(keep))
        masked[p + "o_proj.weight"][:, drop] = 0  # a removed head contributes nothing
    reference = type(stories)(c, masked, stories.source)
    torch.testing.assert_close(
        logits_of(rebuild(pruned), PROMPT_IDS), logits_of(rebuild(reference), PROMPT_IDS), rtol=1e-4, atol=1e-4
    )


def test_structured_output_loads_in_transformers(stories, tmp_path):
    transformers = pytest.importorskip("transformers")
    from speclm.compress.save import save_checkpoint
    from speclm.tokenizer import load_tokenizer

    pruned = prune_structured(stories, rebuild(stories), "attention-heads", 0.5)
    save_checkpoint(str(tmp_path), pruned.config, pruned.tensors, load_tokenizer(STORIES_MODEL, STORIES_TOKENIZER))
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    with torch.no_grad():
        hf_logits = hf(torch.tensor([PROMPT_IDS])).logits[0]
    torch.testing.assert_close(hf_logits, logits_of(rebuild(pruned), PROMPT_IDS), rtol=1e-4, atol=1e-4)
