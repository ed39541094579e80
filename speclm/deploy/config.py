"""What a deployment runs: the models, replica counts, speculation length and placement (validated at construction)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from speclm.config import CacheConfig, SpecConfig, WeightFormat
from speclm.models.loader import resolve_model_path
from speclm.server.config import ServerConfig

# Environment defaults of the coordinator's settings (docs/deploy.md): MAX_DRAFT_TOKENS is K; DRAFT_ENDPOINT
# and TARGET_ENDPOINT name the Ray node resource that marks the machines each service runs on.
ENV_MAX_DRAFT_TOKENS, ENV_DRAFT_ENDPOINT, ENV_TARGET_ENDPOINT = "MAX_DRAFT_TOKENS", "DRAFT_ENDPOINT", "TARGET_ENDPOINT"
APP_NAME = "speclm"


@dataclass
class DeployConfig:
    """One deployment: target `model` (and `tokenizer`), `draft` model path (None: the target decodes
    alone), replica counts, K (`max_draft_tokens`, the most when `adaptive`), how long the target waits on
    a draft call before decoding that sequence alone (`draft_timeout`), torch threads per replica, and the
    Ray node resources that pin the draft and target replicas to their machines (None: anywhere)."""

    model: str | None = None  # None: the default model
    draft: str | None = None
    tokenizer: str | None = None
    weights: str = "auto"
    draft_weights: str | None = None  # None: the draft: spec's default (q4_0)
    draft_replicas: int = 1
    target_replicas: int = 1
    max_draft_tokens: int = 4
    adaptive: bool = True
    draft_timeout: float = 30.0
    threads: int | None = None
    spec_max_batch: int = 8
    draft_endpoint: str | None = None
    target_endpoint: str | None = None
    cache: CacheConfig = field(default_factory=CacheConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    def __post_init__(self) -> None:
        for name in ("draft_replicas", "target_replicas", "spec_max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if not 1 <= self.max_draft_tokens <= 32:
            raise ValueError(f"max-draft-tokens must be in 1..32, got {self.max_draft_tokens}")
        if not self.draft_timeout > 0:
            raise ValueError(f"draft-timeout must be > 0 seconds, got {self.draft_timeout}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        WeightFormat.parse(self.weights)
        # Resolved here, once: every replica loads the same path (on a cluster it must exist on each machine).
        self.model = resolve_model_path(self.model)
        if self.draft is not None:
            self.draft = resolve_model_path(self.draft)
        if self.tokenizer is not None and not os.path.exists(self.tokenizer):
            raise FileNotFoundError(f"tokenizer file not found: {self.tokenizer}")
        self.draft_spec()  # validates K and the draft's options

    def draft_spec(self) -> SpecConfig | None:
        """The draft:PATH spec both services build from (the target's engine and the draft's proposer)."""
        if self.draft is None:
            return None
        argument = self.draft if self.draft_weights is None else f"{self.draft},weights={self.draft_weights}"
        return SpecConfig("draft", argument, self.max_draft_tokens, self.adaptive)

    @staticmethod
    def env_defaults() -> dict:
        """Defaults taken from the environment (MAX_DRAFT_TOKENS, DRAFT_ENDPOINT, TARGET_ENDPOINT)."""
        out: dict = {}
        if os.environ.get(ENV_MAX_DRAFT_TOKENS):
            value = os.environ[ENV_MAX_DRAFT_TOKENS]
            if not value.isdigit():
                raise ValueError(f"{ENV_MAX_DRAFT_TOKENS} must be a positive integer, got {value!r}")
            out["max_draft_tokens"] = int(value)
        for key, env in (("draft_endpoint", ENV_DRAFT_ENDPOINT), ("target_endpoint", ENV_TARGET_ENDPOINT)):
            if os.environ.get(env):
                out[key] = os.environ[env]
        return out
