"""`speclm bench --compare` bookkeeping: interleaving, medians, ratios and greedy agreement."""

from __future__ import annotations

from speclm.bench.compare import first_divergence, summarize, time_engines


class FakeEngine:
    """Returns fixed tokens and a fixed duration, and logs the call order."""

    def __init__(self, name: str, tokens: list[int], seconds: list[float], log: list) -> None:
        self.name, self.tokens, self.seconds, self.log = name, tokens, list(seconds), log

    def generate(self, prompt_ids, max_tokens):
        self.log.append(self.name)
        if max_tokens == 4:  # warm-up
            return self.tokens[:4], 0.0
        return self.tokens[:max_tokens], self.seconds.pop(0)


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) == 3
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2


def test_engines_are_interleaved_and_summarized():
    log: list[str] = []
    ref = FakeEngine("ref", [1, 2, 3, 4, 5, 6], [1.0, 1.0, 2.0, 2.0, 3.0, 3.0], log)
    peer = FakeEngine("peer", [1, 2, 9, 4, 5, 6], [2.0, 2.0, 2.0, 2.0, 2.0, 2.0], log)
    records = time_engines([ref, peer], [[7], [8]], max_tokens=6, repeats=3, progress=lambda m: None)
    assert log == ["ref", "peer"] + ["ref", "peer"] * 6  # warm-ups, then repeat > prompt > engine
    s = summarize(records, reference="ref", baseline="peer")
    # ref: per repeat 12 tokens in 2, 4, 6 s -> 6, 3, 2 tokens/s, median 3; peer: 3 tokens/s always
    assert s["ref"]["tokens_per_s_runs"] == [6.0, 3.0, 2.0] and s["ref"]["tokens_per_s"] == 3.0
    assert s["peer"]["tokens_per_s"] == 3.0 and s["ref"]["ratio_to_baseline"] == 1.0
    assert s["ref"]["first_divergence"] == [6, 6] and s["peer"]["first_divergence"] == [2, 2]
