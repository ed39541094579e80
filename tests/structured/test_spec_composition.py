"""The pieces compose into exact constrained speculation: forced tokens as free drafts, proposer drafts
cut at the first token the grammar rejects, target rows masked per row, the matcher advanced over what
verification commits. Greedy constrained speculative output equals greedy constrained AR, token for
token, on a synthetic target (logits a fixed function of the context)."""

import json

import jsonschema
import pytest
import torch

from speclm.sample.masked import masked_target_logits, select_masked
from speclm.sample.tree import TokenTree
from speclm.sampling_params import SamplingParams
from speclm.structured.grammar import compile_constraint
from speclm.structured.matcher import GrammarMatcher
from tests.sample.test_rejection import verify_chain
from tests.structured.test_matcher import SCHEMAS

GREEDY = SamplingParams(temperature=0.0)


def target_logits(context: list[int], vocab: int) -> torch.Tensor:
    """[vocab]: random, but a fixed function of the last three tokens (a stand-in for a model)."""
    gen = torch.Generator().manual_seed(hash(tuple(context[-3:])) % 2**62)
    return torch.randn(vocab, generator=gen) * 4


def greedy_ar(vocab, constraint, max_tokens=200) -> list[int]:
    matcher, out = GrammarMatcher(vocab, constraint), []
    while len(out) < max_tokens:
        token = int(
            select_masked(target_logits(out, vocab.vocab_size)[None], GREEDY, matcher.allowed_mask()[None], None)
        )
        out.append(token)
        if token in vocab.eos_token_ids:
            break
        assert matcher.advance([token]) == 1
    return out


def greedy_speculative(vocab, constraint, reference, gen, k=4, max_tokens=200, mask_rows=True):
    """Chains of forced tokens + proposer drafts (half copied from the reference, half random); returns
    the output, the target passes used, and the forced tokens accepted."""
    matcher, out, passes, forced_used = GrammarMatcher(vocab, constraint), [], 0, 0
    while len(out) < max_tokens and not (out and out[-1] in vocab.eos_token_ids):
        forced = matcher.forced_tokens()
        start = len(out) + len(forced)
        proposal = [
            reference[i]
            if i < len(reference) and torch.rand(1, generator=gen) < 0.6
            else int(torch.randint(vocab.vocab_size, (1,), generator=gen))
            for i in range(start, start + k)
        ]
        chain = forced + proposal
        chain = chain[: matcher.valid_prefix_length(chain)]  # cut at the first token the grammar rejects
        tree = TokenTree.chain(len(chain))
        masks, valid = matcher.tree_masks(tree, chain)
        assert all(valid)
        rows = torch.stack([target_logits(out + chain[:i], vocab.vocab_size) for i in range(len(chain) + 1)])
        passes += 1
        rows = masked_target_logits(rows, masks) if mask_rows else rows
        result = verify_chain(rows, chain, None, GREEDY)
        forced_used += min(result.num_accepted, len(forced))
        tokens = result.tokens
        if any(t in vocab.eos_token_ids for t in tokens):
            tokens = tokens[: next(i for i, t in enumerate(tokens) if t in vocab.eos_token_ids) + 1]
        out += tokens
        body = [t for t in tokens if t not in vocab.eos_token_ids]
        if matcher.advance(body) < len(body):  # left the grammar (only without masked rows)
            break
    return out, passes, forced_used


@pytest.mark.parametrize("schema", SCHEMAS[:2])
def test_greedy_constrained_speculation_equals_constrained_ar(smol_vocab, smol_tokenizer, schema):
    constraint = compile_constraint("json_schema", schema, "schema")
    reference = greedy_ar(smol_vocab, constraint)
    assert reference[-1] in smol_vocab.eos_token_ids
    jsonschema.validate(json.loads(smol_tokenizer.decode(reference[:-1])), schema)
    gen = torch.Generator().manual_seed(0)
    out, passes, forced_used = greedy_speculative(smol_vocab, constraint, reference, gen)
    assert out == reference
    assert forced_used > 0 and passes < len(reference)  # the skeleton came as free drafts


def test_negative_control_unmasked_target_rows_leave_the_grammar(smol_vocab):
    """Verifying against the unmasked target (drafts still cut by the grammar) does not reproduce the
    constrained output: the masking of the target rows is what the equality above rests on."""
    constraint = compile_constraint("json_schema", SCHEMAS[1], "schema")
    reference = greedy_ar(smol_vocab, constraint)
    out, _, _ = greedy_speculative(smol_vocab, constraint, reference, torch.Generator().manual_seed(0), mask_rows=False)
    assert out != reference
