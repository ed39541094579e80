"""Stop conditions and streaming text: EOS, max_tokens, stop strings, the context limit."""

from __future__ import annotations

from speclm.sampling_params import SamplingParams
from speclm.tokenizer import IncrementalDetokenizer, Tokenizer


class OutputTracker:
    """Accumulates a request's tokens and text, decides when it is finished, and hands out text
    deltas that never contain (a prefix of) a stop string."""

    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: list[int], params: SamplingParams, max_total_tokens: int
    ) -> None:
        self.tokenizer = tokenizer
        self.params = params
        self.max_total_tokens = max_total_tokens
        self.prompt_len = len(prompt_ids)
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.eos_ids = set() if params.ignore_eos else set(tokenizer.eos_token_ids)
        self.token_ids: list[int] = []
        self.text = ""
        self.emitted = 0
        self.finish_reason: str | None = None
        self.holdback = max((len(s) for s in params.stop), default=1) - 1

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        """Tokens still allowed by max_tokens and the context."""
        return min(
            self.params.max_tokens - len(self.token_ids), self.max_total_tokens - self.prompt_len - len(self.token_ids)
        )

    def finish(self, reason: str) -> None:
        """End the output now (a grammar that is complete, or that reached a dead end)."""
        self.finish_reason = reason

    def add(self, tokens: list[int]) -> int:
        """Commit tokens one by one until finished; returns how many were taken."""
        for i, token in enumerate(tokens):
            self.token_ids.append(token)
            if token in self.eos_ids:
                self.finish_reason = "stop"
                return i + 1
            self.text += self.detokenizer.add([token])
            if self.params.stop and self._cut_at_stop_string():
                return i + 1
            if self.remaining <= 0:
                self.finish_reason = "length"
                return i + 1
        return len(tokens)

    def _cut_at_stop_string(self) -> bool:
        window_start = max(0, self.emitted - self.holdback)
        hits = [i for s in self.params.stop if (i := self.text.find(s, window_start)) >= 0]
        if not hits:
            return False
        self.text = self.text[: min(hits)]
        self.finish_reason = "stop"
        return True

    def take_delta(self) -> str:
        """New text safe to show: all of it once finished, else minus a possible stop-string prefix."""
        end = len(self.text) if self.finished else max(self.emitted, len(self.text) - self.holdback)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
