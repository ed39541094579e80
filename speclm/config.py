"""Engine-level configuration: which model, which speculative method, how many draft tokens."""
from __future__ import annotations

from dataclasses import dataclass

SPEC_METHODS_HELP = "ngram | ngram:MAX_N | layerskip:N | draft:PATH"


@dataclass
class SpecConfig:
    """A parsed --spec value: method 'ngram' (prompt lookup), 'layerskip' (first N target layers as
    the draft) or 'draft' (a separate model sharing the tokenizer)."""

    method: str
    argument: str | None = None
    num_speculative_tokens: int = 4
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "layerskip", "draft"):
            raise ValueError(f"unknown speculative method {self.method!r}; expected {SPEC_METHODS_HELP}")
        if not 1 <= self.num_speculative_tokens <= 32:
            raise ValueError(f"--k must be in 1..32, got {self.num_speculative_tokens}")
        if self.method == "layerskip" and not (self.argument or "").isdigit():
            raise ValueError(f"layerskip needs a layer count, e.g. layerskip:4; got {self.argument!r}")
        if self.method == "draft" and not self.argument:
            raise ValueError("draft needs a model path, e.g. draft:/path/to/model.gguf")
        if self.method == "ngram" and self.argument is not None and not self.argument.isdigit():
            raise ValueError(f"ngram takes an optional maximum n, e.g. ngram:4; got {self.argument!r}")

    @classmethod
    def parse(cls, spec: str, num_speculative_tokens: int = 4, adaptive: bool = True) -> "SpecConfig":
        method, _, argument = spec.partition(":")
        return cls(method.strip().lower(), argument or None, num_speculative_tokens, adaptive)

    @property
    def label(self) -> str:
        return self.method if self.argument is None else f"{self.method}:{self.argument}"
