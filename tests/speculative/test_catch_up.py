"""A draft model reads a prompt (its catch-up) only where that pays back: at most CATCH_UP_SHARE of the
target's expected time for the tokens still wanted. Otherwise the hybrid drafts by prompt lookup alone
and a pure draft proposes nothing; either way the output is plain greedy decoding's."""

import pytest

from speclm import SamplingParams
from speclm.engine.speculation import CATCH_UP_SHARE
from speclm.speculative.draft_model import CatchUpRate
from tests.helpers import engine_with_proposer, generate_one

STORY = "Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. "
OTHER = "One day a big bird flew over the town. The bird was looking for food for its babies in the nest. "


def long_prompt(llm, text: str, tokens: int) -> list[int]:
    ids = llm.tokenizer.encode(text * 40)
    assert len(ids) >= tokens
    return ids[:tokens]


def engine_and_proposer(stories_llm, perturbed_stories_dir, options: str = ""):
    llm = stories_llm.with_spec(f"draft:{perturbed_stories_dir}{options}", num_speculative_tokens=4)
    proposer = llm.proposers(llm.spec)
    return llm, proposer, engine_with_proposer(llm, proposer, 4, adaptive=True)


def test_catch_up_rate_counts_long_catch_ups_only():
    rate = CatchUpRate()
    assert rate.seconds(1000) == 0.0  # nothing measured: no estimate
    rate.record(CatchUpRate.MIN_TOKENS - 1, 10.0)  # a step's few new tokens are drafting, not a catch-up
    assert rate.seconds_per_token is None
    rate.record(100, 0.5)
    assert rate.seconds(200) == pytest.approx(1.0)


def test_a_loaded_draft_prices_its_first_catch_up(stories_llm, perturbed_stories_dir):
    """The factory seeds the rate with a timed read at load, so the first long prompt is priced, not read
    unmeasured (an unseeded rate prices every catch-up at 0 s)."""
    _, hybrid, _ = engine_and_proposer(stories_llm, perturbed_stories_dir)
    assert hybrid.draft.catch_up_rate.seconds_per_token > 0
    fresh = hybrid.draft.fresh()
    fresh.start(long_prompt(stories_llm, OTHER, 300), 512)
    assert fresh.catch_up_seconds(long_prompt(stories_llm, OTHER, 300)) > 0
    layerskip = stories_llm.with_spec("layerskip:2")
    assert layerskip.proposers(layerskip.spec).catch_up_rate.seconds_per_token > 0


def test_a_request_measures_the_draft_catch_up_and_the_target_pass(stories_llm, perturbed_stories_dir):
    llm, hybrid, engine = engine_and_proposer(stories_llm, perturbed_stories_dir)
    prompt = long_prompt(llm, STORY, 200)
    generate_one(engine, llm._request(prompt, SamplingParams(max_tokens=24)))
    assert hybrid.draft.catch_up_rate.seconds_per_token > 0
    assert engine.pass_costs.seconds(0) > 0
    # a fresh copy for another sequence shares the rate (same model, same machine) and prices what it has
    # not read: the whole of a new prompt, nothing for a context within a step's tokens of its cache
    other = hybrid.draft.fresh()
    other.start(long_prompt(llm, OTHER, 300), 512)
    assert other.catch_up_seconds(long_prompt(llm, OTHER, 300)) == pytest.approx(
        hybrid.draft.catch_up_rate.seconds(300 - len(other.cached_ids))
    )
    assert hybrid.draft.catch_up_seconds(list(hybrid.draft.cached_ids) + [5, 6]) == 0.0


@pytest.mark.parametrize("options", ["", ",lookup=off"])
def test_a_catch_up_that_cannot_pay_is_skipped_and_the_output_stays_exact(stories_llm, perturbed_stories_dir, options):
    llm, proposer, engine = engine_and_proposer(stories_llm, perturbed_stories_dir, options)
    draft = proposer if options else proposer.draft
    prompt = long_prompt(llm, OTHER, 300)
    step = 0.001
    # a catch-up of 300 tokens at 1 ms a token (0.3 s) against 8 tokens wanted at 1 ms a pass: skipped
    draft.catch_up_rate.seconds_per_token = step
    engine.pass_costs.record(0, step)
    params = SamplingParams(max_tokens=10)
    expected = stories_llm.generate(prompt, params)[0].token_ids
    out = generate_one(engine, llm._request(prompt, params))
    assert out.token_ids == expected
    assert len(draft.cached_ids) < 10, "the draft read the prompt"
    if options:  # the pure draft has nothing else: the sequence decoded without drafts
        assert out.stats.drafted_tokens == 0
    else:  # the hybrid drafted by lookup alone (the prompt repeats itself)
        assert proposer.lookup_only and proposer.proposals["draft"] == 0 and proposer.proposals["lookup"] > 0


def test_a_cold_engine_measures_a_plain_step_before_pricing_a_catch_up(stories_llm, perturbed_stories_dir):
    """No target pass measured yet (a new engine's first request): the first decoding step runs without
    drafts, and the catch-up is weighed against what it measured. Here it is priced far too high to pay,
    so the draft never reads the prompt (made unpriced, it would have read all of it)."""
    llm, hybrid, engine = engine_and_proposer(stories_llm, perturbed_stories_dir)
    assert engine.pass_costs.seconds(0) is None
    hybrid.draft.catch_up_rate.seconds_per_token = 1.0
    prompt = long_prompt(llm, OTHER, 300)
    params = SamplingParams(max_tokens=24)
    expected = stories_llm.generate(prompt, params)[0].token_ids
    out = generate_one(engine, llm._request(prompt, params))
    assert out.token_ids == expected
    assert engine.pass_costs.seconds(0) > 0
    assert len(hybrid.draft.cached_ids) < 10, "the draft read the prompt before a target pass was measured"
    assert hybrid.lookup_only and hybrid.proposals["lookup"] > 0


def test_a_catch_up_that_pays_is_made(stories_llm, perturbed_stories_dir):
    llm, hybrid, engine = engine_and_proposer(stories_llm, perturbed_stories_dir)
    prompt = long_prompt(llm, OTHER, 300)
    wanted = 100
    # the same catch-up priced just within CATCH_UP_SHARE of the target's time for the tokens wanted
    hybrid.draft.catch_up_rate.seconds_per_token = 0.9 * CATCH_UP_SHARE * wanted * 0.001 / len(prompt)
    engine.pass_costs.record(0, 0.001)
    params = SamplingParams(max_tokens=wanted + 1)
    expected = stories_llm.generate(prompt, params)[0].token_ids
    out = generate_one(engine, llm._request(prompt, params))
    assert out.token_ids == expected
    # the draft read the prompt and drafted (a later catch-up over what lookup committed may still be
    # skipped near the end, when few tokens are left to pay it back)
    assert hybrid.proposals["draft"] > 0 and len(hybrid.draft.cached_ids) >= len(prompt)


@pytest.mark.parametrize("after_plain_steps", [False, True])
def test_the_first_proposal_after_steps_without_drafts_is_not_charged_as_drafting(after_plain_steps):
    """A probe after speculation was off also reads the tokens of the steps without drafts: charged as
    drafting, its whole catch-up would be priced per drafted token and keep speculation off."""
    from speclm.engine.request import GenerationStats
    from speclm.engine.speculation import Speculation
    from speclm.sample.rejection import VerificationResult
    from speclm.sample.tree import TokenTree
    from speclm.speculative.controller import PassCosts
    from speclm.speculative.ngram import NgramProposer

    spec = Speculation.of(NgramProposer(), 4, True, [1, 2, 3], 64, PassCosts())
    spec.num_verified, spec.controller.draft_time = 1, 0.001
    if after_plain_steps:
        spec.record_plain_step(0.02)
    spec.proposed, spec.proposer_seconds = False, 1.0  # (a proposal whose time was mostly catching up)
    spec.record(TokenTree.chain(2), VerificationResult([5], 0, False), 0.03, GenerationStats())
    expected = 0.001 if after_plain_steps else (1 - 0.2) * 0.001 + 0.2 * 0.5
    assert spec.controller.draft_time == pytest.approx(expected)
    assert spec.costs.seconds(2) == pytest.approx(0.03)
