"""OpenAI-style request schemas (pydantic) and their translation to SamplingParams."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from speclm.sampling_params import SamplingParams


class _GenerationRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions (unknown fields are ignored, as OpenAI's are)."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)  # not in OpenAI's API; vLLM accepts it too
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    ignore_eos: bool = False

    def sampling_params(self, default_max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
                              max_tokens=self.max_tokens or default_max_tokens, stop=stop, ignore_eos=self.ignore_eos)


class CompletionRequest(_GenerationRequest):
    """POST /v1/completions: one prompt, as text or token ids."""

    prompt: str | list[int] | list[str]
    echo: bool = False
    logprobs: int | None = None


class ChatMessage(BaseModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatCompletionRequest(_GenerationRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    """The OpenAI error envelope."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
