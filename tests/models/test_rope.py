"""The rotary tables start small and grow on demand; a position's cos/sin do not depend on when the
tables grew."""

import torch

from speclm.models.config import ModelConfig
from speclm.models.rope import INITIAL_POSITIONS, RotaryEmbedding


def test_tables_grow_on_demand_with_the_same_values():
    config = ModelConfig(
        architecture="qwen2",
        vocab_size=64,
        hidden_size=256,
        intermediate_size=512,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
    )  # Qwen2.5's rotary settings (head_dim 128)
    rope = RotaryEmbedding(config)
    assert rope.cos_table.shape[0] == INITIAL_POSITIONS  # not the whole 32k context at load
    late = torch.tensor([5, INITIAL_POSITIONS + 7, 20000])
    cos, sin = rope(late)
    assert rope.cos_table.shape[0] > 20000
    whole = RotaryEmbedding(config)
    whole._grow(32768)  # the old way: every position at once
    assert torch.equal(cos, whole.cos_table[late]) and torch.equal(sin, whole.signed_sin_table[late])
