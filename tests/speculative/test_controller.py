"""Adaptive speculation length."""

from speclm.speculative.controller import SpeculationController


def feed(controller, k, accepted, draft_s, target_s, times=30):
    for _ in range(times):
        controller.record(k, accepted, draft_s * k, target_s)


def test_high_acceptance_cheap_draft_uses_max_k():
    c = SpeculationController(max_k=8)
    c.record(0, 0, 0.0, 0.010)
    feed(c, 8, 8, 0.0001, 0.011)
    assert c.next_k() == 8


def test_low_acceptance_expensive_draft_turns_speculation_off_then_probes_again():
    c = SpeculationController(max_k=4, probe_interval=3)
    c.record(0, 0, 0.0, 0.010)
    feed(c, 4, 0, 0.004, 0.012)
    assert c.next_k() == 0
    assert [c.next_k() for _ in range(3)] == [0, 0, 0]
    c.acceptance = 0.95  # things changed: a probe step may speculate again
    c.draft_time = 0.0001
    assert c.next_k() > 0


def test_moderate_acceptance_picks_intermediate_k():
    c = SpeculationController(max_k=8)
    c.record(0, 0, 0.0, 0.010)
    feed(c, 2, 1, 0.002, 0.011)
    k = c.next_k()
    assert 1 <= k < 8


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
    assert tree.acceptance > chain.acceptance
