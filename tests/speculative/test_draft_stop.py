"""A draft model ends its chain once the product of its top probabilities falls below `stop` (draft:PATH,stop=P):
the chain's length is what that rule gives, the default K follows the option, and the output stays exact
(greedy here and in test_greedy_equality; sampled in test_exactness's draft-stop case)."""

import pytest
import torch

from speclm import SamplingParams
from speclm.config import DEFAULT_K, DRAFT_STOP_K, SpecConfig
from speclm.models.attention import AttentionMetadata
from speclm.speculative.draft_model import DraftModelProposer

GREEDY = SamplingParams(temperature=0.0)


def test_stop_parses_and_sets_the_default_k():
    assert SpecConfig.parse("draft:/m.gguf").draft_path_and_options()[1]["stop"] == 0.0  # K drafts every step
    assert SpecConfig.parse("draft:/m.gguf").max_k == DEFAULT_K
    assert SpecConfig.parse("draft:/m.gguf,stop=0.5").max_k == DRAFT_STOP_K
    assert SpecConfig.parse("draft:/m.gguf,stop=0.5,branch=0.4").max_k == DEFAULT_K  # a tree's K: its nodes
    assert SpecConfig.parse("draft:/m.gguf,stop=0.5", 3).max_k == 3  # --k wins
    assert SpecConfig.parse("ngram").max_k == DEFAULT_K
    for bad in ("stop=1", "stop=-0.1", "stop=x"):
        with pytest.raises(ValueError, match="bad draft option"):
            SpecConfig.parse(f"draft:/m.gguf,{bad}")


def chain_confidence(proposer: DraftModelProposer, context: list[int], tokens: list[int]) -> list[float]:
    """The draft's top probability before each of `tokens` (after `context`), from one pass over both."""
    ids = context + tokens
    model = proposer.model
    cache = model.new_cache(len(ids))
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)), cache, AttentionMetadata(0, len(ids)))
        logits = proposer.head.logits(hidden[len(context) - 1 : len(ids) - 1])
    return torch.softmax(logits, dim=-1).max(dim=-1).values.tolist()


def test_a_chain_ends_where_the_product_of_top_probabilities_falls_below_stop(stories_llm, perturbed_stories_dir):
    llm = stories_llm.with_spec(f"draft:{perturbed_stories_dir},lookup=off,stop=0")
    context = llm.tokenizer.encode("Once upon a time, there was a little")
    full = llm.proposers(llm.spec).fresh()
    full.start(context, 64)
    tokens = full.propose(context, 8, GREEDY, None).tokens
    assert len(tokens) == 8  # stop=0: every draft the step asks for
    products = torch.tensor(chain_confidence(full, context, tokens)).cumprod(0).tolist()
    assert products[-1] < 0.9 * products[0]  # the draft is unsure somewhere along the chain
    # a threshold halfway between two consecutive products: the chain ends with the first draft below it
    end = next(i for i in range(1, 8) if products[i] < 0.95 * products[i - 1])
    stop = (products[end] + products[end - 1]) / 2
    other = llm.with_spec(f"draft:{perturbed_stories_dir},lookup=off,stop={stop:.6f}")
    stopping = other.proposers(other.spec)
    assert stopping.stop == pytest.approx(stop, abs=1e-6)
    proposer = stopping.fresh()
    proposer.start(context, 64)
    assert proposer.propose(context, 8, GREEDY, None).tokens == tokens[: end + 1]


def test_stopping_chains_keep_greedy_output_and_draft_less(stories_llm, perturbed_stories_dir):
    prompts = ["Once upon a time", "Tom and Lily went to the park", "The little dog"]
    params = SamplingParams(max_tokens=48)
    drafted = {}
    for stop in ("0", "0.9"):
        llm = stories_llm.with_spec(f"draft:{perturbed_stories_dir},lookup=off,stop={stop}", 8, adaptive=False)
        outs = [llm.generate(p, params)[0] for p in prompts]
        for prompt, out in zip(prompts, outs, strict=True):
            assert out.token_ids == stories_llm.generate(prompt, params)[0].token_ids
        drafted[stop] = sum(o.stats.drafted_tokens for o in outs) / sum(o.stats.decode_steps for o in outs)
    assert drafted["0"] == pytest.approx(8, abs=1.0)  # (the last steps of a request are shorter)
    assert drafted["0.9"] < 0.8 * drafted["0"]
