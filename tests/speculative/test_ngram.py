"""Prompt-lookup matching."""

from speclm.speculative.ngram import find_continuation


def test_longest_suffix_match_wins_and_latest_occurrence_is_used():
    context = [1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 2, 3]
    # suffix [2, 3] occurs at 1 and 5; the latest (5) is followed by 7, 8
    assert find_continuation(context, 2, 1, 4) == [7, 8]
    # a longer suffix [5, 2, 3] has no earlier match, so n falls back to 2


def test_proposal_is_cut_at_k_and_at_end_of_context():
    context = [4, 5, 6, 4, 5]
    assert find_continuation(context, 5, 1, 3) == [6, 4, 5]
    assert find_continuation(context, 1, 1, 3) == [6]


def test_no_match_gives_nothing():
    assert find_continuation([1, 2, 3, 4], 4, 1, 3) == []
    assert find_continuation([1], 4, 1, 3) == []


def test_min_n_is_respected():
    assert find_continuation([1, 2, 9, 3, 2], 2, 2, 3) == []
    assert find_continuation([1, 2, 9, 3, 2], 2, 1, 3) == [9, 3]


def test_a_constrained_request_also_takes_single_token_matches():
    from speclm.sampling_params import SamplingParams
    from speclm.speculative.ngram import NgramProposer
    from speclm.structured.grammar import compile_constraint

    context = [1, 2, 9, 3, 2]  # only the last token, 2, occurs earlier
    proposer = NgramProposer()
    assert proposer.propose(context, 2, SamplingParams(), None).tokens == []
    constrained = SamplingParams(constraint=compile_constraint("regex", "[a-z]+", "c"))
    assert proposer.propose(context, 2, constrained, None).tokens == [9, 3]
