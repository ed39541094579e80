"""Constrained decoding in the engine (issue 34): greedy constrained speculative output equals greedy
constrained AR token for token for every proposer (forced tokens, chain cuts and masked verification
together), every "stop" output is valid against its schema, dead ends and max_tokens cuts end the
request with a clear finish_reason, and sampled tokens follow the masked target (a G-test with a
negative control)."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest
import torch

from speclm import SamplingParams
from speclm.models.attention import AttentionMetadata
from speclm.sample.masked import masked_probs
from speclm.sample.sampler import processed_probs
from speclm.structured.grammar import compile_constraint
from speclm.structured.matcher import GrammarMatcher
from tests.gtest import g_test
from tests.speculative.test_exactness import batched, sample_two_tokens

SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title", "year"],
}
STORY_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "happy": {"type": "boolean"},
    },
    "required": ["name", "age", "happy"],
}
CONSTRAINTS = {
    "schema": ("json_schema", STORY_SCHEMA),
    "regex": ("regex", r"(Once|One day), [a-z]+( [a-z]+){3,6}\."),
    "choice": ("choice", ["Tom was happy.", "Lily was sad.", "The cat sat on the mat."]),
}
STORY_PROMPTS = ["Once upon a time", "Tom and Lily went to the park. Tom"]


def _check(text: str, kind: str, value) -> None:
    if kind == "json_schema":
        jsonschema.validate(json.loads(text), value)
    elif kind == "regex":
        import re

        assert re.fullmatch(value, text), text
    else:
        assert text in value


@pytest.fixture(scope="module")
def stories_reference(stories_llm):
    out = {}
    for name, (kind, value) in CONSTRAINTS.items():
        params = SamplingParams(max_tokens=48, constraint=compile_constraint(kind, value, "c"))
        out[name] = [stories_llm.generate(p, params)[0] for p in STORY_PROMPTS]
    return out


def test_constrained_ar_outputs_are_valid(stories_reference):
    for name, outputs in stories_reference.items():
        kind, value = CONSTRAINTS[name]
        for out in outputs:
            assert out.finish_reason in ("stop", "length"), out.finish_reason
            if out.finish_reason == "stop":
                _check(out.text, kind, value)
    assert any(o.finish_reason == "stop" for outs in stories_reference.values() for o in outs)


@pytest.mark.parametrize("method", ["ngram", "lookahead", "hybrid", "draft", "draft-tree", "layerskip:2"])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_constrained_speculative_greedy_equals_constrained_ar(
    stories_llm, stories_reference, perturbed_stories_dir, method, k
):
    spec = {
        "hybrid": f"draft:{perturbed_stories_dir}",  # under a grammar: lookup alone (CONSTRAINED_LOOKUP_ONLY)
        "draft": f"draft:{perturbed_stories_dir},lookup=off",
        "draft-tree": f"draft:{perturbed_stories_dir},branch=0.6,lookup=off",
    }.get(method, method)
    llm = stories_llm.with_spec(spec, num_speculative_tokens=k, adaptive=False)
    drafted = 0
    for name, (kind, value) in CONSTRAINTS.items():
        params = SamplingParams(max_tokens=48, constraint=compile_constraint(kind, value, "c"))
        for prompt, expected in zip(STORY_PROMPTS, stories_reference[name]):
            out = llm.generate(prompt, params)[0]
            assert out.token_ids == expected.token_ids, (method, k, name, prompt)
            assert out.finish_reason == expected.finish_reason
            drafted += out.stats.drafted_tokens
    assert drafted > 0


def test_stats_count_forced_tokens_and_grammar_time(stories_llm):
    """A constrained request's stats: the forced tokens committed as free drafts (the schema's keys and
    punctuation) and the time its grammar took; an unconstrained request has neither."""
    params = SamplingParams(max_tokens=48, constraint=compile_constraint("json_schema", STORY_SCHEMA, "c"))
    llm = stories_llm.with_spec("ngram", num_speculative_tokens=4, adaptive=False)
    out = llm.generate("Once upon a time", params)[0]
    prefix = '{"name": "'  # forced at the start: at least its tokens are free drafts
    assert out.text.startswith(prefix)
    assert len(stories_llm.tokenizer.encode(prefix, False)) <= out.stats.forced_tokens <= len(out.token_ids)
    assert out.stats.forced_tokens <= out.stats.accepted_tokens
    assert 0 < out.stats.grammar_seconds < out.stats.seconds
    ar = stories_llm.generate("Once upon a time", params)[0]
    assert ar.stats.forced_tokens == 0 and ar.stats.grammar_seconds > 0  # no drafts: nothing proposed as forced
    plain = llm.generate("Once upon a time", SamplingParams(max_tokens=8))[0]
    assert plain.stats.forced_tokens == 0 and plain.stats.grammar_seconds == 0


def test_draft_trees_are_masked_per_node(stories_llm, perturbed_stories_dir, monkeypatch):
    """A draft model's greedy tree under a grammar: every node it proposes is one the grammar allows on
    its path (its chain and its runner-up leaves are drawn from masked rows), branches included; the
    output equals constrained AR (test above)."""
    from speclm.engine.speculation import Speculation

    seen = {"nodes": 0, "branched": 0}
    propose = Speculation._constrained

    def checked(self, proposer, context, wanted, room, params, generator, matcher):
        tokens = propose(self, proposer, context, wanted, room, params, generator, matcher)
        raw = self.proposal
        if tokens and raw.parents is not None:
            _, valid = matcher.tree_masks(raw.tree(), raw.tokens)
            assert all(valid), (raw.tokens, raw.parents, valid)
            seen["nodes"] += len(raw.tokens)
            seen["branched"] += len(set(raw.parents)) < len(raw.parents)
        return tokens

    monkeypatch.setattr(Speculation, "_constrained", checked)
    # only the proposer's own tree counts: no cut may hide an invalid node
    monkeypatch.setattr(GrammarMatcher, "valid_nodes", lambda self, tree, tokens: list(range(len(tokens))))
    spec = f"draft:{perturbed_stories_dir},branch=0.9,lookup=off"
    llm = stories_llm.with_spec(spec, num_speculative_tokens=6, adaptive=False)
    for kind, value in CONSTRAINTS.values():
        params = SamplingParams(max_tokens=48, constraint=compile_constraint(kind, value, "c"))
        for prompt in STORY_PROMPTS:
            llm.generate(prompt, params)
    assert seen["nodes"] > 20 and seen["branched"] > 0, seen


@pytest.mark.parametrize("spec", [None, "ngram", "lookahead", "draft-self"])
def test_default_model_json_schema_is_valid_and_exact(default_llm, spec):
    """The default model, asked for a book: JSON valid against the schema, the same with speculation."""
    params = SamplingParams(max_tokens=60, constraint=compile_constraint("json_schema", SCHEMA, "schema"))
    prompt = default_llm.tokenizer.encode_chat(
        [{"role": "user", "content": "Give me a famous book as JSON with title and year."}]
    )
    reference = default_llm.generate(prompt, params)[0]
    assert reference.finish_reason == "stop"
    jsonschema.validate(json.loads(reference.text), SCHEMA)
    if spec is not None:
        llm = default_llm.with_spec(
            f"draft:{default_llm.model_path},lookup=off" if spec == "draft-self" else spec,
            num_speculative_tokens=4,
            adaptive=False,
        )
        out = llm.generate(prompt, params)[0]
        assert out.token_ids == reference.token_ids
        assert out.stats.accepted_tokens > 0  # forced tokens at least


def test_max_tokens_cut_and_dead_end_finish_clearly(stories_llm):
    params = SamplingParams(max_tokens=3, constraint=compile_constraint("json_schema", STORY_SCHEMA, "c"))
    out = stories_llm.generate("Once", params)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    # A regex whose only continuation is a character no token of stories260K's vocabulary can spell
    # in the allowed way is a dead end after its first token: the request ends, the engine goes on.
    params = SamplingParams(max_tokens=10, constraint=compile_constraint("regex", "a\U0001f600{5}", "c"))
    out = stories_llm.generate("Once", params)[0]
    assert out.finish_reason in ("grammar_dead_end", "stop", "length")
    assert stories_llm.generate("Once", SamplingParams(max_tokens=4))[0].finish_reason == "length"


def _exact_masked_pairs(llm, prompt_ids, params, constraint, masked=True):
    """P(t1, t2) of the constrained (or, masked=False, the unconstrained) processed distribution."""
    model, n = llm.model, len(prompt_ids)
    matcher = GrammarMatcher(llm.engine.grammar_vocab(), constraint)
    with torch.inference_mode():
        cache = model.new_cache(n + 1)
        hidden = model(torch.tensor(prompt_ids), torch.arange(n), cache, AttentionMetadata(0, n))
        logits = model.compute_logits(hidden[-1:])
        p1 = masked_probs(logits, params, matcher.allowed_mask()[None]) if masked else processed_probs(logits, params)
        p1 = p1[0].double()
        pairs = {}
        for t1 in torch.nonzero(p1).flatten().tolist():
            cache.truncate(n)
            h = model(torch.tensor([t1]), torch.tensor([n]), cache, AttentionMetadata(n, 1))
            logits = model.compute_logits(h)
            if masked:
                matcher.advance([t1])
                p2 = masked_probs(logits, params, matcher.allowed_mask()[None])[0].double()
                matcher.rollback(1)
            else:
                p2 = processed_probs(logits, params)[0].double()
            for t2 in torch.nonzero(p2).flatten().tolist():
                pairs[(t1, t2)] = float(p1[t1] * p2[t2])
    return pairs


@pytest.mark.parametrize("spec", [None, "draft"])
def test_constrained_sampling_follows_the_masked_target(stories_llm, perturbed_stories_dir, spec):
    """A G-test of two sampled tokens under a regex, against the masked target's exact distribution
    (passes), and against the unmasked one (the negative control: fails)."""
    constraint = compile_constraint("regex", "[a-z ]+", "c")
    # (three tokens: the prompt's pass draws the first; the next step verifies a draft for the second)
    params = SamplingParams(temperature=1.0, top_k=4, max_tokens=3, ignore_eos=True, constraint=constraint)
    draft = f"draft:{perturbed_stories_dir},lookup=off"  # the draft model's masked draws
    llm = batched(stories_llm if spec is None else stories_llm.with_spec(draft, 2, adaptive=False))
    prompt_ids = stories_llm.encode("Once upon a time")
    exact = _exact_masked_pairs(stories_llm, prompt_ids, params, constraint)
    wrong = _exact_masked_pairs(stories_llm, prompt_ids, params, constraint, masked=False)
    samples = 1500
    pair_counts = sample_two_tokens(llm, prompt_ids, params, samples)  # (asserts that a draft was verified)
    counts = {(int(t1), int(t2)): int(pair_counts[t1, t2]) for t1, t2 in zip(*np.nonzero(pair_counts))}
    assert g_test(counts, exact, samples) > 1e-3
    assert g_test(counts, wrong, samples) < 1e-3


@pytest.mark.parametrize("constrained", [False, True])
def test_logprobs_are_the_same_with_and_without_speculation(stories_llm, perturbed_stories_dir, constrained):
    """Greedy: every token's logprob and top-5 come from the target's rows (masked under a grammar), so
    ngram, draft and lookahead speculation report what plain decoding reports."""
    constraint = compile_constraint("json_schema", STORY_SCHEMA, "c") if constrained else None
    params = SamplingParams(max_tokens=40, logprobs=5, constraint=constraint)
    reference = stories_llm.generate("Once upon a time", params)[0]
    assert len(reference.logprobs) == len(reference.token_ids)
    for lp, token in zip(reference.logprobs, reference.token_ids):
        assert lp.token == token and lp.top[0][0] == token  # greedy: the chosen token is the most likely
        assert lp.logprob <= 0 and len(lp.top) <= 5
    for spec in ["ngram", f"draft:{perturbed_stories_dir},lookup=off", "lookahead"]:
        out = stories_llm.with_spec(spec, num_speculative_tokens=4, adaptive=False).generate(
            "Once upon a time", params
        )[0]
        assert out.token_ids == reference.token_ids
        for a, b in zip(out.logprobs, reference.logprobs):
            assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [t for t, _ in a.top] == [t for t, _ in b.top]


def test_every_sample_of_n_follows_the_grammar(stories_llm):
    """n > 1: each sample (forked after the prompt) has a matcher of its own."""
    from speclm.engine.request import Request

    choices = ["Tom was happy.", "Lily was sad.", "The cat sat on the mat."]
    params = SamplingParams(
        temperature=1.0, seed=3, max_tokens=20, constraint=compile_constraint("choice", choices, "c")
    )
    llm = stories_llm.with_spec("ngram", num_speculative_tokens=3)
    outputs = llm.engine.generate([Request("n3", stories_llm.encode("Once upon a time"), params)], n=4)[0]
    assert len(outputs) == 4
    for out in outputs:
        assert out.finish_reason == "stop" and out.text in choices
