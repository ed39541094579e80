"""Draft heads that ride on the target's hidden states: Medusa (parallel heads) and EAGLE (one
feature-level decoder layer). Both reuse the target's embeddings and output head, so a head file
holds only its own few weights.

Conventions (shared by the trainer in speclm/distill and the proposers in speclm/speculative):
- A *feature* f_t is the target's hidden state after the final norm at position t, so
  target.lm_head(f_t) are the target's logits for token t+1.
- Medusa head i (0-based) maps f_t to a feature whose logits predict token t+2+i (the target
  itself predicts t+1).
- EAGLE row t takes fc([f_t ; embed(x_{t+1})]) through one decoder layer (its own KV cache,
  rotary position t+1) and outputs a predicted feature f^_{t+1}; lm_head(f^_{t+1}) predicts token
  t+2. Drafting feeds predicted features back in for the following rows.
- `token_map` (optional, [V'] token ids) restricts a head's output to a frequent-token subset to
  cut the head matmul; the target still scores the full vocabulary, so verification stays exact.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from speclm.kv.cache import KVCache
from speclm.models.attention import AttentionMetadata
from speclm.models.config import ModelConfig
from speclm.models.layers import DecoderLayer
from speclm.models.rope import RotaryEmbedding

HEAD_CONFIG = "speclm_head.json"
HEAD_WEIGHTS = "head.safetensors"


class ResidualBlock(nn.Module):
    """x + SiLU(W x + b); W starts at zero so an untrained block is the identity (Medusa's init)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K parallel heads on the last feature; head i predicts the token 2+i positions ahead."""

    kind = "medusa"

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        num_heads: int = 4,
        num_layers: int = 1,
        token_map: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"Medusa needs num_heads >= 1 and num_layers >= 1, got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.heads = nn.ModuleList(
            nn.Sequential(*(ResidualBlock(hidden_size) for _ in range(num_layers))) for _ in range(num_heads)
        )
        self.register_buffer("token_map", _check_token_map(token_map, vocab_size))

    def forward(self, features: torch.Tensor) -> torch.Tensor:  # [n, hidden] -> [num_heads, n, hidden]
        return torch.stack([head(features) for head in self.heads])

    def config_dict(self) -> dict:
        return {
            "kind": self.kind,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
        }


class EagleHead(nn.Module):
    """EAGLE's draft: fc([feature; next-token embedding]) -> one decoder layer -> next feature."""

    kind = "eagle"

    def __init__(self, target_config: ModelConfig, token_map: torch.Tensor | None = None) -> None:
        super().__init__()
        self.target_config = target_config
        h = target_config.hidden_size
        self.hidden_size, self.vocab_size = h, target_config.vocab_size
        self.fc = nn.Linear(2 * h, h)
        self.layer = DecoderLayer(target_config)
        self.rotary = RotaryEmbedding(target_config)
        self.register_buffer("token_map", _check_token_map(token_map, self.vocab_size))

    def new_cache(self, capacity: int) -> KVCache:
        c = self.target_config
        p = self.fc.weight
        return KVCache(1, c.num_kv_heads, c.head_dim, capacity, p.dtype, p.device)

    def forward(
        self,
        features: torch.Tensor,  # [n, hidden]: f_t (or a predicted one)
        next_embeds: torch.Tensor,  # [n, hidden]: target.embed_tokens(x_{t+1})
        positions: torch.Tensor,  # [n]: t+1, the position of the token whose embedding is fed
        cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [n, hidden]: predicted f_{t+1}
        """Runs rows at cache slots meta.start..; with a fresh cache and AttentionMetadata(0, n) this
        is the causal training forward (gradients flow when called outside inference mode)."""
        x = self.fc(torch.cat([features, next_embeds], dim=-1))
        cos, sin = self.rotary(positions)
        k_cache, v_cache = cache.layer(0)
        return self.layer(x, cos, sin, k_cache, v_cache, meta)

    def config_dict(self) -> dict:
        return {"kind": self.kind, "target_config": self.target_config.to_hf_dict()}


DraftHead = MedusaHeads | EagleHead


def _check_token_map(token_map: torch.Tensor | None, vocab_size: int) -> torch.Tensor | None:
    if token_map is None:
        return None
    token_map = torch.as_tensor(token_map, dtype=torch.long).flatten()
    if token_map.numel() == 0 or int(token_map.min()) < 0 or int(token_map.max()) >= vocab_size:
        raise ValueError(f"token_map must hold token ids in [0, {vocab_size}), got {token_map.numel()} ids")
    return token_map


def save_head(head: DraftHead, directory: str | Path, metadata: dict | None = None) -> Path:
    """Write `speclm_head.json` + `head.safetensors` into directory (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = head.config_dict() | {"metadata": metadata or {}}
    tensors = {k: v.detach().contiguous() for k, v in head.state_dict().items() if k != "token_map"}
    if head.token_map is not None:
        tensors["token_map"] = head.token_map.contiguous()
    save_file(tensors, str(directory / HEAD_WEIGHTS))
    (directory / HEAD_CONFIG).write_text(json.dumps(config, indent=2))
    return directory


def load_head(directory: str | Path, target_config: ModelConfig | None = None) -> DraftHead:
    """Load a head saved by save_head; with target_config, check it fits that target."""
    directory = Path(directory)
    config_path, weights_path = directory / HEAD_CONFIG, directory / HEAD_WEIGHTS
    if not config_path.is_file() or not weights_path.is_file():
        raise ValueError(f"{directory} is not a draft-head directory (needs {HEAD_CONFIG} and {HEAD_WEIGHTS})")
    try:
        config = json.loads(config_path.read_text())
        tensors = load_file(str(weights_path))
    except (json.JSONDecodeError, OSError, RuntimeError) as e:
        raise ValueError(f"cannot read draft head in {directory}: {e}") from e
    token_map = tensors.pop("token_map", None)
    kind = config.get("kind")
    if kind == "medusa":
        head: DraftHead = MedusaHeads(
            config["hidden_size"], config["vocab_size"], config["num_heads"], config["num_layers"], token_map
        )
    elif kind == "eagle":
        head = EagleHead(ModelConfig.from_hf_dict(config["target_config"]), token_map)
    else:
        raise ValueError(f"{config_path}: unknown head kind {kind!r} (expected medusa or eagle)")
    missing, unexpected = head.load_state_dict(tensors, strict=False)
    missing = [m for m in missing if m != "token_map"]
    if missing or unexpected:
        raise ValueError(f"{weights_path}: missing tensors {missing}, unexpected tensors {unexpected}")
    if target_config is not None and (head.hidden_size, head.vocab_size) != (
        target_config.hidden_size,
        target_config.vocab_size,
    ):
        raise ValueError(
            f"draft head in {directory} was trained for hidden size {head.hidden_size} and vocabulary "
            f"{head.vocab_size}; the target has {target_config.hidden_size} and {target_config.vocab_size}"
        )
    return head.eval()


def cuts_rows_cheaply(lm_head: nn.Module) -> bool:
    """Whether draft_lm_head cuts a few rows of this head without dequantizing all of it first (it does
    for an int8, int4 or bf16 head)."""
    from speclm.models.quant_linear import QuantizedLinear

    return not isinstance(lm_head, QuantizedLinear)


def draft_lm_head(lm_head: nn.Module, token_map: torch.Tensor | None) -> nn.Module:
    """The output head a proposer drafts with, built once: the target's head itself, or with a
    token_map a head over the subset rows ([V', hidden]; column j of its logits is token
    token_map[j]) in the target head's runtime format (a quantized head has no fp32 `.weight`)."""
    if token_map is None:
        return lm_head
    from speclm.config import WeightFormat
    from speclm.models.gguf_weights import GGUFLinear
    from speclm.models.quant_linear import BF16Linear, QuantizedLinear
    from speclm.models.w8a8_linear import W8A8Linear
    from speclm.models.weight_formats import make_linear

    if isinstance(lm_head, (W8A8Linear, GGUFLinear)):  # the subset's rows on the head's own grid
        return lm_head.rows(token_map)
    if isinstance(lm_head, QuantizedLinear):  # int8 for an int8/int4 head (V' need not suit int4 packing)
        weight = lm_head.dequantized_weight()[token_map]  # [V', hidden]
        fmt = WeightFormat("bf16" if isinstance(lm_head, BF16Linear) else "int8")
    else:
        weight, fmt = lm_head.weight.detach()[token_map], WeightFormat("fp32")
        weight = weight.float() if weight.device.type == "cpu" else weight  # (a GPU head keeps its bf16)
    return make_linear(weight.contiguous(), None, fmt)
