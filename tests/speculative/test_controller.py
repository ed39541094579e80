"""Adaptive speculation length: K from per-position acceptance and measured costs, prompt catch-up not
counted as drafting cost, and probes that can turn speculation back on."""

from speclm.speculative.controller import SpeculationController


def feed(controller, k, accepted, draft_s, target_s, times=30):
    for _ in range(times):
        controller.record(k, accepted, draft_s * k, target_s)


def test_high_acceptance_cheap_draft_uses_max_k():
    c = SpeculationController(max_k=8)
    c.record(0, 0, 0.0, 0.010)
    feed(c, 8, 8, 0.0001, 0.011)
    assert c.next_k() == 8


def test_a_costly_first_proposal_does_not_switch_speculation_off():
    """The first proposal makes a draft model prefill the prompt: ten times a drafted token's cost.
    Counted as drafting cost it made speculation look hopeless; it must not."""
    c = SpeculationController(max_k=4)
    c.record(0, 0, 0.0, 0.030)  # a plain pass: 30 ms
    c.record(4, 4, 0.400, 0.036, catch_up=True)  # prompt prefill inside the first proposal
    feed(c, 4, 4, 0.006, 0.036, times=3)  # then 6 ms per drafted token, all accepted
    assert c.next_k() == 4
    assert abs(c.draft_time - 0.006) < 1e-9


def test_low_acceptance_turns_speculation_off_and_probes_bring_it_back():
    c = SpeculationController(max_k=4, probe_interval=3, probe_k=2)
    c.record(0, 0, 0.0, 0.010)
    feed(c, 4, 0, 0.004, 0.012)
    assert c.next_k() == 0
    assert [c.next_k() for _ in range(3)] == [0, 0, 2]  # off, then a probe step
    c.record(2, 0, 0.008, 0.011)  # the probe failed too: off for twice as long
    assert [c.next_k() for _ in range(7)] == [0] * 6 + [2]
    for _ in range(12):  # the text changed: probes are now accepted
        c.record(2, 2, 0.001, 0.011)
    assert c.next_k() > 0


def test_moderate_acceptance_picks_intermediate_k():
    c = SpeculationController(max_k=8)
    c.record(0, 0, 0.0, 0.010)
    feed(c, 2, 1, 0.002, 0.011)
    k = c.next_k()
    assert 1 <= k < 8


def test_acceptance_is_measured_per_position():
    """Draft 1 always accepted, draft 2 never: the chance of using a third draft is zero, and the
    expected tokens of K >= 2 stop growing at 2."""
    c = SpeculationController(max_k=6, prior_weight=0.01)
    for _ in range(40):
        c.record(4, 1, 0.004, 0.02)
    assert c.acceptance(0) > 0.99 and c.acceptance(1) < 0.01
    assert abs(c.expected_tokens(1) - 2.0) < 0.02 and abs(c.expected_tokens(6) - c.expected_tokens(2)) < 0.02


def test_unmeasured_k_costs_follow_a_line_through_the_measured_ones():
    c = SpeculationController(max_k=8)
    c.record(0, 0, 0.0, 0.010)
    c.record(4, 4, 0.001, 0.014)
    assert abs(c.target_seconds(2) - 0.012) < 1e-9 and abs(c.target_seconds(8) - 0.018) < 1e-9


def test_fixed_k_when_not_adaptive():
    c = SpeculationController(max_k=5, adaptive=False)
    feed(c, 5, 0, 0.01, 0.01)
    assert c.next_k() == 5


def test_tree_budget_counts_tokens_by_depth_not_nodes():
    """A 16-node tree only 2 levels deep yields at most 3 tokens; paying for 16 rows must not look
    like a 16-deep chain, and a path that reaches the bottom level counts as fully accepted."""
    chain = SpeculationController(max_k=16)
    tree = SpeculationController(max_k=16, depth_of=lambda k: min(k, 2))
    assert tree.expected_tokens(16) == tree.expected_tokens(2) < chain.expected_tokens(16)
    tree.record(16, 2, 0.001, 0.02, depth=2)
    chain.record(16, 2, 0.001, 0.02)
    assert tree.acceptance(2) > chain.acceptance(2)  # the chain saw a rejection at its third draft, the tree none


def test_a_rarely_tried_position_takes_after_the_one_before_it():
    """Early steps tried K = 6 and missed at position 3; since then K = 3 was always accepted. Position 3's
    old miss fades, and its estimate leans on position 2's (near 1), not on a fixed prior, so K grows
    again. Negative control: with a fixed prior (the previous rule) K stays lower."""

    class FixedPrior(SpeculationController):
        def acceptance(self, position: int) -> float:
            i = min(position, len(self.tries) - 1)
            return (self.hits[i] + self.prior_weight * self.prior_acceptance) / (self.tries[i] + self.prior_weight)

    chosen = []
    for cls in (SpeculationController, FixedPrior):
        c = cls(max_k=6, explore_interval=10**9)
        c.record(0, 0, 0.0, 0.040)
        for _ in range(3):
            c.record(6, 3, 0.060, 0.060)
        for _ in range(40):
            c.record(3, 3, 0.030, 0.048)
        c.target_time.update({4: 0.050, 5: 0.052, 6: 0.054})
        chosen.append(c.next_k())
    assert chosen[0] == 6 > chosen[1]


def test_exploration_measures_one_position_deeper_now_and_then():
    c = SpeculationController(max_k=6, explore_interval=4, prior_weight=0.01)
    c.record(0, 0, 0.0, 0.010)
    feed(c, 2, 1, 0.004, 0.012)  # position 1 never accepted: the best K is 1
    ks = [c.next_k() for _ in range(8)]
    assert ks == [1, 1, 1, 2, 1, 1, 1, 2]


def test_the_first_step_proposes_little_before_anything_is_measured():
    c = SpeculationController(max_k=6, probe_k=2)
    assert c.next_k() == 2
    c.record(2, 2, 0.002, 0.011, catch_up=True)  # prefill-laden: no drafting cost measured yet
    assert c.next_k() == 2
    c.record(2, 2, 0.002, 0.011)
    assert c.next_k() == 6  # cheap drafts, all accepted: the maximum
