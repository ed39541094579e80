"""What the HTTP server accepts and how it behaves: key, limits, drain time (validated at construction)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ServerConfig:
    """Per-server settings; every limit answers an OpenAI-schema 4xx when exceeded.

    model_name: the id /v1/models lists (requests naming another model are served by this one).
    api_key: required as `Authorization: Bearer KEY` on /v1/ and /metrics (unless metrics_open).
    max_body_bytes: request bodies above this get 413 before any parsing.
    max_prompt_tokens: prompts longer than this get 400 (None: the model's context bounds them).
    max_n, max_stop, max_stop_chars: per-request bounds on samples and stop strings.
    max_concurrent_requests: generation requests in flight at once; more get 429.
    drain_seconds: on SIGTERM, how long in-flight requests may finish before they are cancelled.
    """

    model_name: str = "speclm"
    api_key: str | None = None
    metrics_open: bool = False
    max_body_bytes: int = 2 * 2**20
    max_prompt_tokens: int | None = None
    max_n: int = 16
    max_stop: int = 16
    max_stop_chars: int = 512
    max_concurrent_requests: int = 256
    drain_seconds: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_n", "max_stop", "max_stop_chars", "max_concurrent_requests"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if not self.drain_seconds >= 0:
            raise ValueError(f"drain_seconds must be >= 0, got {self.drain_seconds}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("the API key must not be empty")
