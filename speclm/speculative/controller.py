"""Adaptive speculation length: choose K from measured acceptance and measured costs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class SpeculationController:
    """Picks K each step to maximise expected tokens per second, and turns speculation off when
    plain decoding is faster.

    With per-token acceptance probability a, a step proposing K tokens yields on average
    (1 - a^(K+1)) / (1 - a) tokens and costs target_time(K) + K * draft_time. Both times and a are
    running averages of what this request measured. After switching off, it probes again later.
    For token trees K is the node budget and `depth_of(K)` the depth such a tree reaches: the
    acceptance is then per level, and a budget of K yields tokens as a chain of depth_of(K) would.
    """

    max_k: int
    adaptive: bool = True
    smoothing: float = 0.2
    probe_interval: int = 16
    acceptance: float = 0.7  # prior until measured
    draft_time: float | None = None  # seconds per proposed token
    target_time: dict[int, float] = field(default_factory=dict)  # K -> seconds per verification pass
    depth_of: Callable[[int], int] | None = None  # tree proposers: node budget -> tree depth
    _steps_off: int = 0

    def next_k(self) -> int:
        if not self.adaptive:
            return self.max_k
        if self._steps_off > 0:
            self._steps_off -= 1
            return 0
        if self.draft_time is None or not self.target_time:
            return self.max_k
        best_k, best_rate = 0, 1.0 / self._target(0)
        for k in range(1, self.max_k + 1):
            rate = self.expected_tokens(k) / (self._target(k) + k * self.draft_time)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            self._steps_off = self.probe_interval
        return best_k

    def expected_tokens(self, k: int) -> float:
        k = self.depth_of(k) if self.depth_of is not None else k
        a = min(self.acceptance, 0.999)
        return (1 - a ** (k + 1)) / (1 - a)

    def _target(self, k: int) -> float:
        if k in self.target_time:
            return self.target_time[k]
        nearest = min(self.target_time, key=lambda m: abs(m - k))
        return self.target_time[nearest]

    def record(
        self, k: int, num_accepted: int, proposer_seconds: float, target_seconds: float, depth: int | None = None
    ) -> None:
        """Fold one step's measurements into the running averages; `depth` is a tree's depth (a
        path ending there saw no rejection), None for a chain of k."""
        s = self.smoothing
        previous = self.target_time.get(k)
        self.target_time[k] = target_seconds if previous is None else (1 - s) * previous + s * target_seconds
        if k == 0:
            return
        per_token = proposer_seconds / k
        self.draft_time = per_token if self.draft_time is None else (1 - s) * self.draft_time + s * per_token
        # Each step shows num_accepted successes and, if it stopped early, one failure.
        observed = num_accepted / (num_accepted + (1 if num_accepted < (depth or k) else 0))
        self.acceptance = (1 - s) * self.acceptance + s * observed
