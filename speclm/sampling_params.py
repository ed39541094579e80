"""Per-request sampling parameters; temperature == 0 means greedy."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# Temperatures below this sample like greedy decoding: logits divided by them would only separate the
# argmax further (and overflow float32 near 1e-37), so they are decoded as temperature 0 (as vLLM does).
GREEDY_TEMPERATURE = 1e-5
SEED_RANGE = (-(2**63), 2**64 - 1)  # any int64 or uint64; sample i of a request uses (seed + i) mod 2**64


@dataclass
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature: 0 (or below GREEDY_TEMPERATURE) for greedy (argmax), else logits are divided by it.
    top_k: keep the k most likely tokens (0 = no limit). top_p: nucleus mass in (0, 1]. min_p: drop
    tokens less likely than min_p times the most likely one (0 = off).
    seed: makes sampling reproducible per request. stop: strings that end generation (excluded
    from the text). max_tokens: upper bound on generated tokens. ignore_eos: keep going past EOS.
    constraint: a grammar the output must follow (speclm.structured.compile_constraint: a JSON schema,
    a regex, a choice, a grammar); None = free text. logprobs: report each generated token's logprob
    and that many most likely alternatives (0: the chosen token's only); None = none.
    presence_penalty, frequency_penalty (OpenAI's, in [-2, 2]): subtracted from the logit of every token
    the output so far holds, once (presence) and once per occurrence (frequency). repetition_penalty
    (vLLM's and transformers', > 0; 1 = off): the logits of tokens in the prompt or the output so far are
    divided by it where positive and multiplied by it where negative. Repetition first, then frequency
    and presence, all before the temperature (speclm/sample/penalties.py), on the target's logits alike in
    plain decoding and in verification, so speculation stays exact under them.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int = 128
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    constraint: object | None = None  # a speclm.structured.grammar.Constraint (a higher layer)
    logprobs: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not _is_number(self.temperature) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not _is_int(self.top_k) or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer (0 disables it), got {self.top_k}")
        # top_p is compared with float32 probabilities: it must stay positive in float32.
        if not _is_number(self.top_p) or not (0.0 < self.top_p <= 1.0) or np.float32(self.top_p) <= 0:
            raise ValueError(f"top_p must be in (0, 1] (and above 0 in float32), got {self.top_p}")
        if not _is_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1] (0 disables it), got {self.min_p}")
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens}")
        if self.seed is not None and (not _is_int(self.seed) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            raise ValueError(f"seed must be an integer in [-2**63, 2**64 - 1], got {self.seed!r}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop strings must be non-empty strings, got {self.stop!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= 20):
            raise ValueError(f"logprobs must be an integer in 0..20, got {self.logprobs!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _is_number(value) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be a number in [-2, 2] (0 disables it), got {value!r}")
        rp = self.repetition_penalty
        if not _is_number(rp) or not math.isfinite(rp) or rp <= 0:
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 disables it), got {rp!r}")

    @property
    def penalized(self) -> bool:
        """Whether a penalty changes the logits (each step's then depend on the tokens before it)."""
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    def sample_seed(self, index: int) -> int | None:
        """The generator seed of sample `index` of a request (None: no seed was given)."""
        return None if self.seed is None else (self.seed + index) % 2**64


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
