"""A draft model copies the cache rows of a prompt prefix it has seen instead of computing them again."""

import torch

from speclm import SamplingParams
from speclm.speculative.draft_model import DraftModelProposer, PromptMemo

GREEDY = SamplingParams(temperature=0.0)


def proposer_pair(stories_llm) -> tuple[DraftModelProposer, DraftModelProposer]:
    """A draft proposer for one sequence and a fresh one for the next, sharing the memo."""
    llm = stories_llm.with_spec("layerskip:3", num_speculative_tokens=4, adaptive=False)
    first = llm.proposers(llm.spec)
    assert isinstance(first, DraftModelProposer)
    return first, first.fresh()


def test_a_shared_prompt_prefix_is_copied_and_proposes_the_same(stories_llm):
    first, second = proposer_pair(stories_llm)
    encode = stories_llm.tokenizer.encode
    a = encode("Once upon a time, there was a little girl named Lily. She")
    b = a[:10] + encode(" liked to play with her ball")
    first.start(a, 64)
    first.propose(a, 3, GREEDY, None)

    second.start(b, 64)
    assert second.cache.length == 10 and second.cached_ids == b[:10]  # copied, not fed
    reference = second.fresh()
    reference.prompt_memo = PromptMemo()  # nothing to copy: computes the whole prompt
    reference.start(b, 64)
    assert reference.cache.length == 0
    for proposer in (second, reference):
        proposer.propose(b, 4, GREEDY, None)
    assert second.cached_ids == reference.cached_ids
    n = len(second.cached_ids)
    torch.testing.assert_close(second.cache.keys[:, :, :n], reference.cache.keys[:, :, :n])
    torch.testing.assert_close(second.cache.values[:, :, :n], reference.cache.values[:, :, :n])


def test_the_memo_follows_the_latest_prompt_and_leaves_its_last_token_to_be_fed(stories_llm):
    first, second = proposer_pair(stories_llm)
    encode = stories_llm.tokenizer.encode
    a, b = encode("Once upon a time, there was a dog."), encode("The sun was hot and the sky was blue.")
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)  # (the BOS token)
    first.start(a, 64)
    first.propose(a, 2, GREEDY, None)
    second.start(a, 64)
    assert second.cache.length == len(a) - 1  # the last token is fed for the first proposal's logits
    second.propose(b, 2, GREEDY, None)  # a different conversation: nothing in common
    third = first.fresh()
    third.start(b, 64)
    assert third.cache.length == shared  # second's prompt a is remembered, not b (b came by propose, not start)
    third.propose(b, 2, GREEDY, None)
    fourth = first.fresh()
    fourth.start(b, 64)
    assert fourth.cache.length == len(b) - 1


def test_engines_share_a_draft_model_but_each_keeps_its_own_memo(stories_llm):
    """Sequences of one engine share the memo; another engine (LLM.with_spec) loads nothing again but
    starts with an empty memo, as with its own prefix cache."""
    one, other = (stories_llm.with_spec("layerskip:3", num_speculative_tokens=4) for _ in range(2))
    a, b = one.proposers(one.spec), other.proposers(other.spec)
    assert isinstance(a, DraftModelProposer) and a.model is b.model
    assert a.prompt_memo is not b.prompt_memo
    assert one.proposers(one.spec).prompt_memo is a.prompt_memo
