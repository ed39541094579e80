"""GrammarMatcher on real tokenizers: masks over the (padded) model vocabulary, advance and rollback,
forced tokens, draft chains cut at the first rejected token, per-node masks of draft trees; and a
random sampler driven by random logits under the mask always produces schema-valid JSON."""

import json

import jsonschema
import pytest
import torch

from speclm.sample.masked import select_masked
from speclm.sample.tree import TokenTree
from speclm.sampling_params import SamplingParams
from speclm.structured.grammar import compile_constraint
from speclm.structured.matcher import GrammarMatcher
from tests.structured.conftest import PADDED_VOCAB

BOOK = {
    "type": "object",
    "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
    "required": ["title", "year"],
    "additionalProperties": False,
}
SCHEMAS = [
    BOOK | {"properties": {"title": {"type": "string", "maxLength": 6}, "year": {"type": "integer"}}},
    {
        "type": "object",
        "properties": {
            "kind": {"enum": ["cat", "dog", "bird"]},
            "legs": {"type": "integer", "minimum": 0, "maximum": 8},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
            "ok": {"type": "boolean"},
        },
        "required": ["kind", "legs", "tags", "ok"],
        "additionalProperties": False,
    },
    {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": "null"}]}, "minItems": 1, "maxItems": 4},
]


def book_matcher(vocab):
    return GrammarMatcher(vocab, compile_constraint("json_schema", BOOK, "schema"))


def sample_constrained(matcher, vocab_size, eos, gen, max_steps=300, eos_bias=0.0):
    """Random logits, masked, sampled at temperature 1 until EOS: the generated tokens (EOS excluded).
    eos_bias raises EOS's logit (where the grammar may go on or stop, e.g. after a complete tool call)."""
    params = SamplingParams(temperature=1.0)
    tokens = []
    for _ in range(max_steps):
        mask = matcher.allowed_mask()
        assert mask.any(), "dead end"
        logits = torch.randn(1, vocab_size, generator=gen) * 4
        logits[0, list(eos)] += eos_bias
        token = int(select_masked(logits, params, mask[None], gen)[0])
        if token in eos:
            assert matcher.is_accepting()
            return tokens
        assert matcher.advance([token]) == 1
        tokens.append(token)
    raise AssertionError(f"no EOS within {max_steps} tokens")


@pytest.mark.parametrize("schema", SCHEMAS)
def test_random_constrained_sampling_gives_schema_valid_json(smol_vocab, smol_tokenizer, schema):
    constraint = compile_constraint("json_schema", schema, "schema")
    gen = torch.Generator().manual_seed(0)
    for _ in range(8):
        matcher = GrammarMatcher(smol_vocab, constraint)
        tokens = sample_constrained(matcher, PADDED_VOCAB, set(smol_vocab.eos_token_ids), gen)
        jsonschema.validate(json.loads(smol_tokenizer.decode(tokens)), schema)


def test_regex_and_choice_on_a_sentencepiece_tokenizer(stories_vocab):
    """stories260K: 512 SentencePiece pieces with byte fallback; the bytes sampled match the regex."""
    import re

    gen = torch.Generator().manual_seed(1)
    for kind, value, check in [
        ("regex", r"(yes|no), [0-9]{2} é", lambda s: re.fullmatch(r"(yes|no), [0-9]{2} é", s)),
        ("choice", ["Lily", "Tim", "the big dog"], lambda s: s in ("Lily", "Tim", "the big dog")),
    ]:
        constraint = compile_constraint(kind, value, kind)
        for _ in range(5):
            matcher = GrammarMatcher(stories_vocab, constraint)
            tokens = sample_constrained(matcher, stories_vocab.vocab_size, {2}, gen)
            text = b"".join(stories_vocab.token_bytes(t) for t in tokens).decode()
            assert check(text), text


def test_mask_is_padded_to_the_model_vocabulary(smol_vocab):
    matcher = book_matcher(smol_vocab)
    mask = matcher.allowed_mask()
    assert mask.shape == (PADDED_VOCAB,) and mask.dtype == torch.bool
    assert not mask[smol_vocab.tokenizer_vocab_size :].any()
    assert matcher.valid_prefix_length([PADDED_VOCAB - 1]) == 0
    assert matcher.advance([PADDED_VOCAB - 1]) == 0 and matcher.error() is None


def test_forced_tokens_of_a_fixed_schema(smol_vocab, smol_tokenizer):
    """The JSON skeleton is forced: '{"title":' at the start, ' "year":' after the title's comma."""
    matcher = book_matcher(smol_vocab)
    forced = matcher.forced_tokens()
    assert smol_tokenizer.decode(forced) == '{"title":'
    assert int(matcher.allowed_mask().sum()) == 1  # only the first forced token
    assert matcher.advance(forced) == len(forced)
    assert matcher.forced_tokens() == []  # ' "' may merge with the title's first characters: not forced
    matcher.advance(smol_tokenizer.encode(' "Dune",', add_bos=False))
    assert smol_tokenizer.decode(matcher.forced_tokens()) == ' "year":'


def test_eos_only_when_accepting_and_alone_when_terminated(smol_vocab, smol_tokenizer):
    matcher = book_matcher(smol_vocab)
    eos = smol_vocab.eos_token_ids[0]
    ids = smol_tokenizer.encode('{"title": "Dune", "year": 1965', add_bos=False)
    matcher.advance(ids)
    assert not matcher.is_accepting() and not matcher.allowed_mask()[eos]
    assert matcher.valid_prefix_length([eos]) == 0
    matcher.advance(smol_tokenizer.encode("}", add_bos=False))
    assert matcher.is_accepting() and matcher.is_terminated()
    assert matcher.allowed_mask().nonzero().flatten().tolist() == sorted(smol_vocab.eos_token_ids)  # (any of them)
    assert matcher.valid_prefix_length([eos]) == 1


def test_advance_rollback_restores_the_state(smol_vocab, smol_tokenizer):
    matcher = book_matcher(smol_vocab)
    ids = smol_tokenizer.encode('{"title": "Dune", "year": 19', add_bos=False)
    matcher.advance(ids[:4])
    before = matcher.allowed_mask().clone()
    assert matcher.advance(ids[4:]) == len(ids) - 4
    assert not torch.equal(matcher.allowed_mask(), before)
    matcher.rollback(len(ids) - 4)
    assert torch.equal(matcher.allowed_mask(), before) and matcher.num_tokens == 4
    with pytest.raises(ValueError, match="cannot roll back 5"):
        matcher.rollback(5)


def test_a_draft_chain_is_cut_at_the_first_rejected_token(smol_vocab, smol_tokenizer):
    matcher = book_matcher(smol_vocab)
    good = smol_tokenizer.encode('{"title": "Dune"', add_bos=False)
    bad = smol_tokenizer.encode("}", add_bos=False)  # a closing brace where a comma must come
    chain = good + bad + good
    assert matcher.valid_prefix_length(chain) == len(good)
    assert matcher.num_tokens == 0  # validation does not move the matcher
    assert matcher.advance(chain) == len(good) and matcher.error() is None


def test_tree_masks_equal_the_masks_along_each_path(smol_vocab, smol_tokenizer):
    matcher = book_matcher(smol_vocab)
    enc = lambda s: smol_tokenizer.encode(s, add_bos=False)  # noqa: E731
    prefix = enc('{"title": "')
    matcher.advance(prefix)
    a, b, bad = enc("Dune")[0], enc("Emma")[0], enc("\n")[0]  # a raw newline cannot be in a JSON string
    close = enc('",')[0]
    # root -> a -> close;  root -> b;  root -> bad -> a (below an invalid node)
    tree = TokenTree((-1, 0, -1, -1, 3))
    drafts = [a, close, b, bad, a]
    state = matcher.allowed_mask().clone()
    masks, valid = matcher.tree_masks(tree, drafts)
    assert valid == [True, True, True, False, False]
    assert torch.equal(matcher.allowed_mask(), state) and matcher.num_tokens == len(prefix)
    assert torch.equal(masks[0], state)
    for node, path in [(0, [a]), (1, [a, close]), (2, [b])]:
        matcher.advance(path)
        assert torch.equal(masks[node + 1], matcher.allowed_mask()), node
        matcher.rollback(len(path))
    assert masks[4].all() and masks[5].all()  # unreachable rows: placeholders
    assert not masks[0][bad]
    # the cut of deterministic drafts: the valid nodes, the same as tree_masks' verdict, state unmoved
    assert matcher.valid_nodes(tree, drafts) == [0, 1, 2]
    assert matcher.num_tokens == len(prefix) and torch.equal(matcher.allowed_mask(), state)
    chain = [a, close, bad, a]
    assert matcher.valid_nodes(TokenTree.chain(4), chain) == list(range(matcher.valid_prefix_length(chain))) == [0, 1]


def test_eos_in_drafts(smol_vocab, smol_tokenizer):
    """A chain or tree may end in EOS where the grammar accepts; nothing after an EOS is valid."""
    matcher = GrammarMatcher(smol_vocab, compile_constraint("regex", "[0-9]+", "regex"))
    eos = smol_vocab.eos_token_ids[0]
    digits = smol_tokenizer.encode("12", add_bos=False)
    assert matcher.valid_prefix_length([eos]) == 0  # nothing yet: not accepting
    assert matcher.valid_prefix_length(digits + [eos] + digits) == len(digits) + 1
    masks, valid = matcher.tree_masks(TokenTree((-1, 0, 1, 2)), digits + [eos, digits[0]])
    assert valid == [True, True, True, False] and masks[3].all()
    assert matcher.valid_nodes(TokenTree((-1, 0, 1, 2, -1)), digits + [eos, digits[0], eos]) == [0, 1, 2]
    choice = GrammarMatcher(smol_vocab, compile_constraint("choice", ["ab"], "choice"))
    ab = smol_tokenizer.encode("ab", add_bos=False)
    assert choice.valid_prefix_length(ab + [eos]) == len(ab) + 1
    choice.advance(ab)
    assert choice.is_terminated() and choice.valid_prefix_length([eos, eos]) == 1
