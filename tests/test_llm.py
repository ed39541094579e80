"""The Python API's sampling behaviour on stories260K: seeds, top_k=1, stop strings, EOS, max_tokens,
and its prompt checks (the engine trusts its requests)."""

from __future__ import annotations

import copy
import re

import pytest

from speclm import SamplingParams
from speclm.engine.engine import Engine
from speclm.engine.request import Request
from tests.conftest import STORIES_GOLDEN

GOLDEN_IDS = [403, 407, 261, 378, 432, 383]


def test_same_seed_same_tokens_different_seeds_differ(stories_llm):
    runs = {
        seed: [
            stories_llm.generate("Once", SamplingParams(temperature=1.0, seed=seed, max_tokens=30))[0].token_ids
            for _ in range(2)
        ]
        for seed in (1, 2, 3)
    }
    for a, b in runs.values():
        assert a == b
    assert len({tuple(a) for a, _ in runs.values()}) == 3


def test_top_k_1_equals_greedy(stories_llm):
    greedy = stories_llm.generate("The cat", SamplingParams(temperature=0.0, max_tokens=40))[0]
    top1 = stories_llm.generate("The cat", SamplingParams(temperature=1.5, top_k=1, seed=7, max_tokens=40))[0]
    assert top1.token_ids == greedy.token_ids and top1.text == greedy.text


def test_stop_string_cuts_text_and_stops(stories_llm):
    out = stories_llm.generate("", SamplingParams(max_tokens=60, stop=[" little"]))[0]
    assert out.text == "Once upon a time, there was a"
    assert out.finish_reason == "stop"
    assert len(out.token_ids) < 60


def test_max_tokens_is_respected(stories_llm):
    for n in (1, 7):
        out = stories_llm.generate("", SamplingParams(max_tokens=n))[0]
        assert out.token_ids == [403, 407, 261, 378, 432, 383, 286][:n]
        assert out.finish_reason == "length" and out.stats.completion_tokens == n


class _WithEos:
    """`llm`'s model and speculative method in an engine of its own whose tokenizer has `eos_id` as its
    end-of-sequence token (stories260K rarely emits its real EOS); `llm`'s tokenizer is left alone."""

    def __init__(self, llm, eos_id: int) -> None:
        tokenizer = copy.copy(llm.tokenizer)
        tokenizer.eos_token_ids = [eos_id]
        self.llm = llm
        self.engine = Engine(llm.runner, tokenizer, llm.cache_config, llm.spec, llm.proposers.for_another_engine())

    def generate(self, prompt: str, params: SamplingParams):
        return self.engine.generate([Request("eos", self.llm.encode(prompt), params)], prompts=[prompt])[0]


def test_eos_stops_generation(stories_llm):
    llm = _WithEos(stories_llm, GOLDEN_IDS[4])
    out = llm.generate("", SamplingParams(max_tokens=40))[0]
    assert stories_llm.tokenizer.eos_token_ids != [GOLDEN_IDS[4]]
    assert out.token_ids == GOLDEN_IDS[:5]  # the EOS token is reported ...
    assert out.text == stories_llm.tokenizer.decode(GOLDEN_IDS[:4])  # ... but not in the text
    assert out.finish_reason == "stop"
    ignoring = llm.generate("", SamplingParams(max_tokens=40, ignore_eos=True))[0]
    assert ignoring.finish_reason == "length" and len(ignoring.token_ids) == 40
    assert ignoring.text.startswith(STORIES_GOLDEN[:40])


def test_eos_stops_speculative_generation_too(stories_llm):
    llm = _WithEos(stories_llm.with_spec("ngram"), GOLDEN_IDS[4])
    out = llm.generate("", SamplingParams(max_tokens=40))[0]
    assert out.token_ids == GOLDEN_IDS[:5] and out.finish_reason == "stop"


def test_stream_chunks_concatenate_to_the_output(stories_llm):
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=50, stop=["park"])
    chunks = list(stories_llm.stream("Lily", params))
    output = chunks[-1].output
    assert "".join(c.text for c in chunks) == output.text
    assert [t for c in chunks for t in c.token_ids] == output.token_ids
    assert output.token_ids == stories_llm.generate("Lily", params)[0].token_ids


def test_generation_stops_at_the_context_limit(stories_llm):
    """stories260K's context is 512 tokens: a 505-token prompt leaves room for exactly 7, with or
    without speculation (whose drafts must be clipped to the context)."""
    ids = stories_llm.tokenizer.encode("the cat sat on the mat. " * 70)[:505]
    plain = stories_llm.generate([ids], SamplingParams(max_tokens=100))[0]
    assert len(plain.token_ids) == 7 and plain.finish_reason == "length"
    spec = stories_llm.with_spec("ngram").generate([ids], SamplingParams(max_tokens=100))[0]
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "length"


def test_bad_prompts_raise_value_error_before_anything_runs(stories_llm):
    """Every prompt check of the Python API: empty, ids outside the vocabulary, no room in the context."""
    vocab, context = stories_llm.model.config.vocab_size, stories_llm.engine.limits.max_total_tokens
    for prompt, message in (
        ([], "the prompt is empty"),
        ([1, vocab], f"prompt token ids must be in 0..{vocab - 1}"),
        ([1] * context, f"prompt is {context} tokens but "),
    ):
        for call in (lambda p: stories_llm.generate([p]), lambda p: list(stories_llm.stream(p))):
            with pytest.raises(ValueError, match=re.escape(message)):
                call(prompt)
    assert not stories_llm.engine.has_unfinished()
    assert stories_llm.generate("Once", SamplingParams(max_tokens=3))[0].finish_reason == "length"


def test_an_llm_builds_its_engine_at_first_use(monkeypatch):
    """A model served by an engine of its own (with_engine; build_app with a cache) allocates one KV
    pool, not two: the LLM's own engine is built only when the LLM itself generates."""
    import speclm.llm as llm_module
    from speclm import LLM
    from speclm.config import CacheConfig
    from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER

    built = []

    class CountedEngine(Engine):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(llm_module, "Engine", CountedEngine)
    llm = LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER)
    served = llm.with_engine(CacheConfig(num_blocks=64))
    greedy = SamplingParams(max_tokens=8)
    text = served.generate("Once upon a time", greedy)[0].text
    assert len(built) == 1 and built[0].block_manager.num_blocks == 64
    assert llm.generate("Once upon a time", greedy)[0].text == text
    assert len(built) == 2 and llm.engine is built[1] and served.engine is built[0]
