"""A generation request, its statistics, and its result."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from speclm.sampling_params import SamplingParams


@dataclass
class GenerationStats:
    """Counters and timings for one request. Speculative fields stay at their AR values for AR."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    target_forwards: int = 0  # every target pass the sequence took part in: prompt chunks (and recomputation) included
    decode_steps: int = 0  # target passes after prefill
    decode_tokens: int = 0  # tokens those passes committed
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    proposer_seconds: float = 0.0
    target_seconds: float = 0.0  # its decoding passes' time (its share of each batch's): plain steps and verifications
    forced_tokens: int = 0  # committed tokens its grammar forced (proposed as free drafts)
    grammar_seconds: float = 0.0  # its grammar's work (GrammarMatcher.seconds); 0 without a constraint

    @property
    def tokens_per_s(self) -> float:
        return self.completion_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """tau: tokens committed per target verification pass (1.0 for plain decoding)."""
        return self.decode_tokens / self.decode_steps if self.decode_steps else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    def record_step(self, num_drafted: int, num_accepted: int, num_committed: int, depth: int | None = None) -> None:
        """One decoding step (a verification pass, or a plain one); `depth` is a token tree's depth
        (per-position counts are per depth then), None for a chain of num_drafted tokens."""
        depth = num_drafted if depth is None else depth
        self.decode_steps += 1
        self.decode_tokens += num_committed
        self.drafted_tokens += num_drafted
        self.accepted_tokens += num_accepted
        while len(self.drafted_per_position) < depth:
            self.drafted_per_position.append(0)
            self.accepted_per_position.append(0)
        for i in range(depth):
            self.drafted_per_position[i] += 1
            if i < num_accepted:
                self.accepted_per_position[i] += 1

    def to_dict(self) -> dict:
        d = asdict(self)
        for name in ("tokens_per_s", "mean_accepted_length", "acceptance_rate", "per_position_acceptance"):
            d[name] = getattr(self, name)
        return d


class PromptError(ValueError):
    """A prompt the engine cannot take; `code` is the OpenAI error code the server answers it with."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class PromptLimits:
    """What an engine accepts. The engine trusts its requests: the edges (the Python API, the server)
    check them against it before queueing them; a deployment's coordinator gets it from the target service."""

    vocab_size: int
    max_total_tokens: int  # prompt + generated tokens of one sequence
    max_num_seqs: int
    context_length: int
    pool_tokens: int  # tokens the KV pool holds

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """PromptError (a ValueError) when the prompt is empty, has ids outside the vocabulary, or leaves
        no room for one generated token."""
        if not prompt_ids:
            raise PromptError("the prompt is empty (no tokens): give at least one token")
        if any(not 0 <= t < self.vocab_size for t in prompt_ids):
            raise PromptError(f"prompt token ids must be in 0..{self.vocab_size - 1}")
        if len(prompt_ids) >= self.max_total_tokens:
            limit = (
                f"the model's context is {self.context_length} tokens"
                if self.max_total_tokens == self.context_length
                else f"the KV cache holds {self.pool_tokens} tokens"
            )
            raise PromptError(
                f"prompt is {len(prompt_ids)} tokens but {limit} (it needs room for at least one generated token)",
                code="context_length_exceeded",
            )


@dataclass
class Request:
    """One prompt (already tokenized) and how to continue it."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


@dataclass
class TokenLogprob:
    """A generated token's log-probability under the target (the grammar's mask applied, temperature 1)
    and the `top` most likely (token, logprob) pairs there, most likely first."""

    token: int
    logprob: float
    top: list[tuple[int, float]]


@dataclass
class RequestOutput:
    """What generation produced: text, token ids, why it stopped, and statistics."""

    request_id: str
    prompt: str | None
    text: str
    token_ids: list[int]
    # "stop" (EOS, a stop string, or a complete grammar) | "length" (max_tokens or context full)
    # | "grammar_dead_end" (a constrained output that no token can continue)
    finish_reason: str
    stats: GenerationStats
    logprobs: list[TokenLogprob] | None = None  # per token, when the request asked (SamplingParams.logprobs)

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }


@dataclass
class StreamChunk:
    """Text and tokens committed by one engine step for a streamed request; `output` is set on the last chunk."""

    text: str
    token_ids: list[int]
    output: RequestOutput | None = None


@dataclass
class SequenceOutput:
    """What one step committed for one sample (`index` < n) of a request. `output` is set when the
    sample finished; `error` when the engine failed the request (its other samples are dropped too)."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    output: RequestOutput | None = None
    num_drafted: int = 0  # speculative tokens verified this step
    num_accepted: int = 0
    draft_depth: int | None = None  # a token tree's depth (None: a chain of num_drafted)
    error: Exception | None = None
    logprobs: list[TokenLogprob] | None = None  # this step's tokens', when the request asked

    @property
    def finished(self) -> bool:
        return self.output is not None or self.error is not None
