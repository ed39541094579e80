"""gemma3's sliding-window layers in a pool of their own (speclm/kv/hybrid.py) on a tiny random checkpoint with
a window of 8 and generations far past it: greedy output equals the masking implementation (a whole-length
pool) and transformers', with and without speculation (chains and token trees), under prefix caching,
preemption, forks and a StreamingLLM window; the local pool holds the window and one block per sequence."""

from __future__ import annotations

import pytest

from speclm import LLM, SamplingParams
from speclm.config import CacheConfig, SpecConfig
from speclm.engine.engine import Engine
from speclm.engine.request import Request
from speclm.kv.hybrid import HybridBlockManager
from tests.helpers import engine_with_proposer
from tests.models.hf_tiny import hf_logits, tiny_hf_model
from tests.speculative.tree_proposers import OracleTreeProposer

transformers = pytest.importorskip("transformers")

WINDOW, BLOCK = 8, 4
PROMPT = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]  # repeats, so n-gram and lookahead draft something
PARAMS = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    from tests.models.test_families import _word_tokenizer

    path = tmp_path_factory.mktemp("gemma3")
    hf_model = tiny_hf_model(
        transformers.Gemma3TextConfig,
        head_dim=24,
        sliding_window=WINDOW,
        query_pre_attn_scalar=20,
        num_hidden_layers=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )
    hf_model.save_pretrained(path)
    _word_tokenizer(path, hf_model.config.vocab_size)
    return hf_model, LLM(str(path), tokenizer=str(path), weights="fp32", threads=1)


def engine(llm, spec: str | None = None, **config) -> Engine:
    return Engine(
        llm.runner,
        llm.tokenizer,
        CacheConfig(block_size=BLOCK, **config),
        None if spec is None else SpecConfig.parse(spec),
        llm.proposers,
    )


def run(e: Engine, prompt=PROMPT, params=PARAMS) -> tuple[list[int], int, int]:
    """One request's tokens, the most local blocks it held once its prompt was done, and its accepted drafts.
    Every decoding step holds no more local blocks than those of the window of its first row and its rows."""
    e.add_request(Request("r", prompt, params))
    tokens, most, accepted = [], 0, 0
    while e.has_unfinished():
        decoding, first = bool(tokens), len(prompt) + len(tokens) - 1  # (the pending token's position)
        drafted = 0
        for out in e.step():
            tokens += out.token_ids
            accepted += out.num_accepted
            drafted += out.num_drafted
        if decoding and isinstance(e.block_manager, HybridBlockManager):
            used = e.block_manager.local.num_used_blocks
            assert used <= (first + drafted) // BLOCK - max(0, first - WINDOW + 1) // BLOCK + 1, (first, drafted)
            most = max(most, used)
    return tokens, most, accepted


def test_plain_and_speculative_greedy_equal_masking_and_transformers(gemma):
    hf_model, llm = gemma
    masked, _, _ = run(engine(llm, sliding_window_pool=False))
    assert len(masked) == 48 and len(PROMPT) + 48 > 4 * WINDOW
    assert hf_logits(hf_model, PROMPT + masked)[len(PROMPT) - 1 : -1].argmax(-1).tolist() == masked
    plain = engine(llm)
    assert isinstance(plain.block_manager, HybridBlockManager) and plain.cache.local.keys.shape[0] == 2
    tokens, most, _ = run(plain)
    assert tokens == masked and most == WINDOW // BLOCK + 1  # the window and one block
    for spec in ("ngram", "lookahead"):
        tokens, most, accepted = run(engine(llm, spec))
        assert tokens == masked and accepted > 0, spec
    int8 = run(engine(llm, kv_cache_dtype="int8"))[0]  # (int8 slots are gathered per sequence)
    assert int8 == run(engine(llm, kv_cache_dtype="int8", sliding_window_pool=False))[0]
    # token trees: the accepted path moves after its root in both pools
    proposer = OracleTreeProposer(PROMPT + masked, llm.model.config.vocab_size, seed=3)
    out = engine_with_proposer(llm, proposer, 8, config=CacheConfig(block_size=BLOCK)).generate(
        [Request("t", PROMPT, PARAMS)]
    )[0][0]
    assert out.token_ids == masked and max(proposer.accepted) >= 3


def test_prefix_cache_preemption_forks_and_streaming_equal_masking(gemma):
    _, llm = gemma
    shared = [(3 * i) % 150 + 1 for i in range(30)]  # a prefix far longer than the window
    requests = [
        Request(f"r{i}", shared + [i + 1, i + 2], SamplingParams(max_tokens=20 + 5 * i, seed=i)) for i in range(4)
    ]
    requests.append(Request("s", shared[:9], SamplingParams(max_tokens=30, temperature=0.8, seed=5)))

    def outputs(**config):
        e = engine(llm, **config)
        first = e.generate(requests[:1])  # its blocks become the prefix cache the others hit
        rest = e.generate(requests[1:], n=2)
        assert e.block_manager.num_used_blocks == 0
        return e, [o.token_ids for group in first + rest for o in group]

    expected = outputs(sliding_window_pool=False)[1]
    e, got = outputs()
    assert got == expected and e.block_manager.stats.hit_tokens > 0 and e.block_manager.local.num_used_blocks == 0
    # small pools: chunked prompts, preemption and recomputation
    small = dict(num_blocks=24, max_num_batched_tokens=8)
    e, got = outputs(**small)
    assert got == expected and e.scheduler.num_preemptions > 0
    assert e.block_manager.local.num_blocks == 24  # (the local pool is never the tighter one: same size)
    # StreamingLLM on the full layers (sinks + 3 recent blocks >= the window): the local layers read the same keys
    streaming = dict(streaming_window=16, attention_sinks=4)
    assert outputs(**streaming)[1] == outputs(sliding_window_pool=False, **streaming)[1]


def test_token_eviction_keeps_one_pool(gemma):
    """H2O and SnapKV compact every layer's entries alike: sliding-window layers then mask a whole-length pool."""
    _, llm = gemma
    e = engine(llm, kv_eviction="h2o", kv_budget=24)
    assert not isinstance(e.block_manager, HybridBlockManager)
    assert len(run(e)[0]) == 48
