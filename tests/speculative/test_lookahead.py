"""Lookahead's proposer alone: its tree shape, its Jacobi window and its n-gram pool."""

import pytest

from speclm.config import SpecConfig
from speclm.sampling_params import SamplingParams
from speclm.speculative.controller import PassCosts
from speclm.speculative.lookahead import LookaheadProposer

GREEDY = SamplingParams()


def test_proposal_is_candidates_then_a_window_chain():
    p = LookaheadProposer(window=3, ngram=3, guesses=2)
    p.start([1, 2, 3], 64)
    context = [5, 6, 7, 5, 6]  # prompt lookup: after "5 6" came 7 5
    proposal = p.propose(context, p.node_budget, GREEDY, None)
    assert proposal.tokens[:2] == [7, 5] and proposal.parents[:2] == [-1, 0]
    window = proposal.observed
    assert len(window) == 3 and [proposal.parents[i] for i in window] == [-1, window[0], window[1]]


def test_jacobi_updates_fill_the_pool_and_become_candidates():
    p = LookaheadProposer(window=4, ngram=2, guesses=3)
    p.start([], 64)
    context = [10, 11, 12]
    proposal = p.propose(context, p.node_budget, GREEDY, None)
    guesses = [proposal.tokens[i] for i in proposal.observed]
    # The target says: after 12 comes 40; after each guess g_j comes 50 + j.
    p.observe_rows(40, [50, 51, 52, 53])
    # 2-grams read off this iteration: (12 -> 40) and (g_j -> 50 + j).
    assert (40,) in p.pool[12]
    assert (50,) in p.pool[guesses[0]]
    # Next step from pending token 12 again (nothing accepted): the pool proposes 40 after it.
    proposal = p.propose(context, p.node_budget, GREEDY, None)
    assert 40 in [proposal.tokens[i] for i, parent in enumerate(proposal.parents) if parent == -1]
    # The window now holds the Jacobi update: position 3 (after the pending token) guesses 40, then 50, 51, 52.
    assert [proposal.tokens[i] for i in proposal.observed] == [40, 50, 51, 52]


def test_budget_cut_keeps_a_tree_and_a_window_prefix():
    p = LookaheadProposer(window=5, ngram=3, guesses=3)
    p.start([], 64)
    proposal = p.propose([1, 2, 3, 1, 2], 4, GREEDY, None)
    assert len(proposal.tokens) == 4 and all(i < 4 for i in proposal.observed)
    limited = proposal.limited_to_depth(1)
    assert all(limited.parents[i] == -1 for i in range(len(limited.tokens)))


@pytest.mark.parametrize("bad", ["5,3", "0,3,3", "5,1,3", "5,3,x", "5,3,9"])
def test_bad_shapes_are_rejected(bad):
    with pytest.raises(ValueError, match="lookahead"):
        SpecConfig.parse(f"lookahead:{bad}")


def test_shape_fixes_the_node_budget():
    from speclm.engine.speculation import Speculation

    s = Speculation.of(
        LookaheadProposer(5, 3, 3), max_k=4, adaptive=True, prompt_ids=[1, 2], max_total_tokens=16, costs=PassCosts()
    )
    assert s.controller.max_k == 5 + 2 * 4 and not s.controller.adaptive
