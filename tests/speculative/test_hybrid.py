"""`draft:PATH` is prompt lookup where the context repeats itself and the draft model elsewhere; the draft
reads a window of a long prompt. Both are exact: the target verifies every draft."""

import pytest
import torch

from speclm import SamplingParams
from speclm.config import SpecConfig
from speclm.speculative.draft_model import DraftModelProposer
from speclm.speculative.hybrid import HybridProposer
from tests.helpers import generate_with_proposer

GREEDY = SamplingParams(temperature=0.0)
REPEATING = "Tom had a red ball. Tom had a red ball. Tom had a red ball. Lily had a"


def draft_llm(stories_llm, directory: str, options: str = "", k: int = 4, adaptive: bool = False):
    return stories_llm.with_spec(f"draft:{directory}{options}", num_speculative_tokens=k, adaptive=adaptive)


def test_draft_options_parse_and_default_to_the_hybrid(stories_llm, perturbed_stories_dir):
    _, options = SpecConfig.parse("draft:/m.gguf,window=256,sinks=8,lookup=off").draft_path_and_options()
    assert (options["window"], options["sinks"], options["lookup"]) == (256, 8, False)
    _, options = SpecConfig.parse("draft:/m.gguf").draft_path_and_options()
    assert options["lookup"] and options["window"] == 0  # the whole prompt (benchmarks/draft_window)
    for bad in ("lookup=maybe", "window=-1", "sinks=x"):
        with pytest.raises(ValueError, match="bad draft option"):
            SpecConfig.parse(f"draft:/m.gguf,{bad}")
    llm = draft_llm(stories_llm, perturbed_stories_dir)
    hybrid = llm.proposers(llm.spec)
    assert isinstance(hybrid, HybridProposer) and isinstance(hybrid.draft, DraftModelProposer)
    pure = draft_llm(stories_llm, perturbed_stories_dir, ",lookup=off")
    assert type(pure.proposers(pure.spec)) is DraftModelProposer


@pytest.mark.parametrize("options", ["", ",window=4,sinks=2", ",window=3,sinks=0", ",branch=0.9"])
@pytest.mark.parametrize("adaptive", [False, True])
def test_hybrid_greedy_equals_plain_greedy_and_uses_both_sources(stories_llm, perturbed_stories_dir, options, adaptive):
    """Prompts that repeat themselves (lookup matches) and ones that do not (the draft model): the output
    is plain greedy's, and on the repeating prompt both sources drafted."""
    params = SamplingParams(max_tokens=64)
    encode = stories_llm.tokenizer.encode
    for prompt in (REPEATING, "Once upon a time", "One day, a little bird"):
        ids = encode(prompt)
        expected = stories_llm.generate(ids, params)[0].token_ids
        for k in (1, 3, 6):
            llm = draft_llm(stories_llm, perturbed_stories_dir, options, k, adaptive)
            proposer = llm.proposers(llm.spec)
            out = generate_with_proposer(llm, proposer, ids, params, k, adaptive)
            assert out.token_ids == expected, (prompt, options, k)
            if prompt == REPEATING and not adaptive:
                assert proposer.proposals["lookup"] > 0 and proposer.proposals["draft"] > 0, proposer.proposals


def test_the_draft_catches_up_on_tokens_that_lookup_proposed(stories_llm, perturbed_stories_dir):
    """After lookup drafted (and the target accepted) tokens the draft never saw, its next proposal is
    the one a draft that followed the whole context would make, from the same cache rows."""
    llm = draft_llm(stories_llm, perturbed_stories_dir, ",window=6,sinks=2")
    hybrid = llm.proposers(llm.spec)
    ids = stories_llm.tokenizer.encode(REPEATING)
    hybrid.start(ids, 128)
    first = hybrid.propose(ids, 4, GREEDY, None)  # lookup: "ball . Tom had" (never measured yet)
    assert hybrid.proposals["lookup"] == 1
    hybrid.update(len(first.tokens))
    context = ids + first.tokens + [stories_llm.tokenizer.encode(" the")[-1]]
    drafted = hybrid.draft.propose(context, 3, GREEDY, None)
    reference = hybrid.draft.fresh()
    reference.start(ids, 128)
    assert reference.propose(context, 3, GREEDY, None).tokens == drafted.tokens
    n = len(reference.cached_ids)
    assert hybrid.draft.cached_ids[:n] == reference.cached_ids
    torch.testing.assert_close(hybrid.draft.cache.keys[:, :, :n], reference.cache.keys[:, :, :n])


def test_a_windowed_draft_reads_the_sinks_and_the_end_of_the_prompt(stories_llm, perturbed_stories_dir):
    llm = draft_llm(stories_llm, perturbed_stories_dir, ",window=4,sinks=2,lookup=off")
    draft = llm.proposers(llm.spec)
    prompt = list(range(10, 20))
    draft.start(prompt, 64)
    assert draft.dropped == 4 and draft.view(prompt + [7]) == [10, 11, 16, 17, 18, 19, 7]
    assert draft._positions(0, 7).tolist() == [0, 1, 6, 7, 8, 9, 10]  # real positions: a gap for the middle
    draft.renumber = True
    assert draft._positions(0, 7).tolist() == list(range(7))
    short = draft.fresh()
    short.start(prompt[:6], 64)
    assert short.dropped == 0 and short.view(prompt[:6]) == prompt[:6]


@pytest.mark.parametrize("renumber", [False, True])
def test_a_windowed_draft_is_its_rows_and_the_memo_keeps_it_so(stories_llm, perturbed_stories_dir, renumber):
    """The windowed draft's cache rows are those of a plain draft run over the view at the view's
    positions; a second sequence with the same prompt copies them from the memo and drafts the same."""
    llm = draft_llm(stories_llm, perturbed_stories_dir, ",window=5,sinks=2,lookup=off")
    first = llm.proposers(llm.spec)
    first.renumber = renumber
    ids = stories_llm.tokenizer.encode(REPEATING)
    first.start(ids, 128)
    drafts = first.propose(ids, 3, GREEDY, None).tokens
    second = first.fresh()
    second.start(ids, 128)
    assert second.cache.length == len(second.view(ids)) - 1  # copied from the memo
    assert second.propose(ids, 3, GREEDY, None).tokens == drafts
    plain = DraftModelProposer(first.model, stop=first.stop)  # no window, over the view as its whole prompt
    view = first.view(ids)
    positions = first._positions(0, len(view) + 8)  # the view's and the drafts'
    plain.start(view, 128)
    plain._positions = lambda start, count: positions[start : start + count]
    assert plain.propose(view, 3, GREEDY, None).tokens == drafts


def test_a_constrained_request_drafts_by_lookup_alone(stories_llm, perturbed_stories_dir, monkeypatch):
    """Under a grammar the hybrid never runs its draft model (not even over the prompt): its drafts are
    lookups, single-token matches included, and its greedy output is constrained AR's."""
    from speclm.structured.grammar import compile_constraint

    fed = []
    monkeypatch.setattr(DraftModelProposer, "_feed", lambda self, tokens: fed.append(tokens))
    params = SamplingParams(max_tokens=48, constraint=compile_constraint("regex", "(Tom had a red ball\\. )+", "c"))
    ids = stories_llm.tokenizer.encode(REPEATING)
    expected = stories_llm.generate(ids, params)[0]
    out = draft_llm(stories_llm, perturbed_stories_dir).generate(ids, params)[0]
    assert out.token_ids == expected.token_ids
    assert fed == [] and out.stats.drafted_tokens > 0 and out.stats.accepted_tokens > 0
    proposer = draft_llm(stories_llm, perturbed_stories_dir).proposers(
        SpecConfig.parse(f"draft:{perturbed_stories_dir}")
    )
    proposer.start([1, 2, 9, 3, 2], 64)  # only the last token, 2, occurs earlier
    assert proposer.propose([1, 2, 9, 3, 2], 2, params, None).tokens == [9, 3]
    assert fed == []
