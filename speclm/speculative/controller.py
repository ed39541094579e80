"""Adaptive speculation length: choose K from measured acceptance per draft position and measured costs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class SpeculationController:
    """Picks K each step to maximise expected tokens per second; K = 0 when plain decoding is faster.

    Expected tokens of a step with K drafts: 1 + sum over j = 1..d of prod over i < j of a_i, where a_i
    is the measured probability that draft position i is accepted once positions before it were, and
    d = K for a chain (depth_of(K) for a token tree, whose K is a node budget). Cost: the measured
    verification time for K plus K times the measured cost of one drafted token.

    What keeps the estimates honest:
    - a proposal that made the proposer catch up (the first of a sequence, on the prompt; or the first
      after steps without drafts, on their tokens) is not counted as drafting cost: that is paid once,
      not per drafted token;
    - verification times are measured per K; a K not measured yet is estimated from a straight line
      through the ones that were (a pass costs about linearly more per row);
    - acceptance counts decay, so the estimates follow the text as it changes;
    - a position measured rarely or long ago leans on the one before it (its prior is that position's
      acceptance, not a fixed number): drafts that got this far usually keep going, and a fixed prior
      below that would make a deeper K look worse than it is, so it would never be tried or re-measured;
    - every `explore_interval` steps with speculation on, K is one more than the best estimate (up to
      max_k), so the next position's acceptance keeps being measured;
    - the first step, before any cost is measured, proposes probe_k drafts, not max_k: a short answer
      does not pay back a first step at the maximum;
    - when speculation is off, a probe step with a small K re-measures acceptance every
      `probe_interval` steps (the interval doubles, up to `max_probe_interval`, while probes keep
      failing), so a request that turned speculation off early can turn it back on.
    """

    max_k: int
    adaptive: bool = True
    smoothing: float = 0.2
    probe_interval: int = 8
    max_probe_interval: int = 64
    probe_k: int = 2
    explore_interval: int = 16
    prior_acceptance: float = 0.7
    prior_weight: float = 1.0
    depth_of: Callable[[int], int] | None = None  # tree proposers: node budget -> tree depth
    draft_time: float | None = None  # seconds per drafted token (steady state)
    target_time: dict[int, float] = field(default_factory=dict)  # K -> seconds per verification pass
    hits: list[float] = field(default_factory=list)  # decayed counts per draft position
    tries: list[float] = field(default_factory=list)
    _steps_off: int = 0
    _interval: int = 0
    _probing: bool = False
    _steps_on: int = 0

    # -- choosing K ----------------------------------------------------------------------
    def next_k(self) -> int:
        if not self.adaptive:
            return self.max_k
        if self._steps_off > 0:
            self._steps_off -= 1
            if self._steps_off == 0:  # re-measure with a small proposal
                self._probing = True
                return min(self.probe_k, self.max_k)
            return 0
        if self.draft_time is None or not self.target_time:  # nothing measured yet: a small first proposal
            return min(self.probe_k, self.max_k)
        best_k, best_rate = 0, 1.0 / self.target_seconds(0)
        for k in range(1, self.max_k + 1):
            rate = self.expected_tokens(k) / (self.target_seconds(k) + k * self.draft_time)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            self._interval = min(self.max_probe_interval, 2 * self._interval) if self._interval else self.probe_interval
            self._steps_off = self._interval
            return 0
        self._interval = 0
        self._steps_on += 1
        if self._steps_on % self.explore_interval == 0:  # measure one position deeper now and then
            return min(best_k + 1, self.max_k)
        return best_k

    def acceptance(self, position: int) -> float:
        """P(draft `position` is accepted | the ones before it were). Each position's prior (weight
        prior_weight) is the position before it (prior_acceptance for the first), so a position with few
        recent observations, or none (deeper than ever measured), takes after the one before it."""
        value, w = self.prior_acceptance, self.prior_weight
        for i in range(min(position + 1, len(self.tries))):
            value = (self.hits[i] + w * value) / (self.tries[i] + w)
        return value

    def expected_tokens(self, k: int) -> float:
        depth = self.depth_of(k) if self.depth_of is not None else k
        total, reach = 1.0, 1.0
        for i in range(depth):
            reach *= min(self.acceptance(i), 0.999)
            total += reach
        return total

    def target_seconds(self, k: int) -> float:
        """Measured time of a verification pass over K drafts, or a straight-line estimate from the measured Ks."""
        return fitted_seconds(self.target_time, k)

    # -- measurements --------------------------------------------------------------------
    def record(
        self,
        k: int,
        num_accepted: int,
        proposer_seconds: float,
        target_seconds: float,
        depth: int | None = None,
        catch_up: bool = False,
    ) -> None:
        """Fold one step into the estimates. `depth`: a tree's depth (None: a chain of k); `catch_up`:
        the proposer also caught up on context it had not read (a prompt, or the tokens of steps without
        drafts), so its time is not drafting cost."""
        s = self.smoothing
        previous = self.target_time.get(k)
        self.target_time[k] = target_seconds if previous is None else (1 - s) * previous + s * target_seconds
        if k == 0:
            return
        if not catch_up:
            per_token = proposer_seconds / k
            self.draft_time = per_token if self.draft_time is None else (1 - s) * self.draft_time + s * per_token
        reached = min(num_accepted + 1, depth or k)  # positions tried: the accepted ones and the first rejection
        while len(self.tries) < reached:
            self.hits.append(0.0)
            self.tries.append(0.0)
        for i in range(len(self.tries)):
            self.hits[i] *= 1 - s / 2
            self.tries[i] *= 1 - s / 2
        for i in range(reached):
            self.tries[i] += 1.0
            self.hits[i] += 1.0 if i < num_accepted else 0.0
        if self._probing:
            self._probing = False
            self._steps_off = 0


def fitted_seconds(times: dict[int, float], k: int) -> float:
    """The time of a pass over K drafts from `times` (K -> measured seconds, not empty): measured, or a
    straight line through the measured Ks (a pass costs about linearly more per row), never below the
    cheapest measured pass."""
    if k in times:
        return times[k]
    points = sorted(times.items())
    if len(points) == 1:
        return points[0][1]
    n = len(points)
    mean_k, mean_t = sum(p for p, _ in points) / n, sum(t for _, t in points) / n
    slope = sum((p - mean_k) * (t - mean_t) for p, t in points) / sum((p - mean_k) ** 2 for p, _ in points)
    return max(mean_t + max(slope, 0.0) * (k - mean_k), min(t for _, t in points))


@dataclass
class PassCosts:
    """What a target pass costs one sequence, measured over every sequence of an engine (K -> seconds,
    decayed like a controller's): a new sequence's controller has measured nothing yet, but the
    engine has. A batch's pass is shared among its rows, so in a batch a sequence's pass costs less."""

    smoothing: float = 0.2
    times: dict[int, float] = field(default_factory=dict)

    def record(self, k: int, seconds: float) -> None:
        previous = self.times.get(k)
        self.times[k] = seconds if previous is None else (1 - self.smoothing) * previous + self.smoothing * seconds

    def seconds(self, k: int) -> float | None:
        """A pass over K drafts (None: nothing measured yet)."""
        return fitted_seconds(self.times, k) if self.times else None
