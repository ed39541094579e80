"""The engine with feature proposers and token trees: Medusa / EAGLE chains and trees and an oracle
tree proposer, several concurrent requests of different lengths (also under chunked prefill and
preemption), give plain greedy output token for token; proposers get the target's own features."""

import os

import pytest
import torch

from speclm import LLM, SamplingParams
from speclm.config import CacheConfig, SpecConfig
from speclm.engine.engine import Engine
from speclm.engine.request import Request
from tests.conftest import STORIES_MODEL, STORIES_TOKENIZER
from tests.engine.test_batch_engine import PROMPTS
from tests.helpers import ContiguousPass, generate_one
from tests.speculative.tree_proposers import OracleTreeProposer, write_perturbed_heads

CONFIGS = [{}, {"num_blocks": 30, "block_size": 4, "max_num_batched_tokens": 16}]  # the second preempts

DRAFTERS = os.path.join(os.path.dirname(__file__), "..", "..", "drafters")

pytestmark = pytest.mark.usefixtures("one_thread")


def requests_of(llm, count=8):
    return [
        Request(f"r{i}", llm.encode(PROMPTS[i % len(PROMPTS)]), SamplingParams(max_tokens=10 + 9 * i, ignore_eos=True))
        for i in range(count)
    ]


@pytest.fixture(scope="module")
def head_dirs(stories_llm, tmp_path_factory):
    return write_perturbed_heads(stories_llm.model.config, tmp_path_factory.mktemp("batch_heads"))


HEAD_SPECS = [
    "medusa:{medusa},width=1",
    "eagle:{eagle},topk=1",  # chains
    "medusa:{medusa},width=3",
    "eagle:{eagle},topk=3,beam=2,depth=4",
]  # trees


@pytest.mark.parametrize("spec", HEAD_SPECS)
def test_batched_head_speculation_equals_plain_greedy(stories_llm, head_dirs, spec):
    """(Whether the heads get the right features is checked with recorded features below.)"""
    spec = spec.format(**head_dirs)
    requests = requests_of(stories_llm)
    expected = [generate_one(stories_llm.engine, r).token_ids for r in requests]
    for config in CONFIGS:
        engine = Engine(
            stories_llm.runner,
            stories_llm.tokenizer,
            CacheConfig(**config),
            SpecConfig.parse(spec, 5, adaptive=False),
            stories_llm.proposers,
            spec_max_batch=8,
        )
        outputs = [o[0] for o in engine.generate(requests)]
        assert [o.token_ids for o in outputs] == expected, config
        assert engine.block_manager.num_used_blocks == 0
        assert sum(o.stats.drafted_tokens for o in outputs) > 0


def test_forks_of_a_chunked_prefill_get_every_prompt_feature(stories_llm, head_dirs):
    """n = 3 samples forked after a prompt prefilled in chunks of 4: each sample's EAGLE head needs
    the features of all the prompt's chunks; greedy samples all equal plain greedy."""
    request = requests_of(stories_llm, 5)[4]
    expected = generate_one(stories_llm.engine, request).token_ids
    spec = SpecConfig.parse(f"eagle:{head_dirs['eagle']}", 4, adaptive=False)
    engine = Engine(
        stories_llm.runner, stories_llm.tokenizer, CacheConfig(max_num_batched_tokens=4), spec, stories_llm.proposers
    )
    outputs = engine.generate([request], n=3)[0]
    assert [o.token_ids for o in outputs] == [expected] * 3
    assert all(o.stats.drafted_tokens > 0 for o in outputs)


@pytest.mark.parametrize("method", ["eagle", "medusa"])
def test_prefix_cache_reuse_by_feature_sequences(stories_llm, head_dirs, method):
    """A cached prefix block holds no features: an EAGLE sequence (it needs every position's) reuses
    none, its blocks still serve a later plain request; Medusa (the last feature only) reuses them.
    Both stay exact."""
    request = requests_of(stories_llm, 5)[4]
    expected = generate_one(stories_llm.engine, request).token_ids
    engine = Engine(
        stories_llm.runner,
        stories_llm.tokenizer,
        CacheConfig(block_size=4),
        SpecConfig.parse(f"{method}:{head_dirs[method]}", 4),
        stories_llm.proposers,
    )
    for i in range(2):
        engine.add_request(Request(f"heads{i}", request.prompt_ids, request.params))
        while engine.has_unfinished():
            for out in engine.step():
                assert out.output is None or out.output.token_ids == expected
    assert (engine.block_manager.stats.hit_tokens > 0) == (method == "medusa")
    # The prompt's blocks are in the prefix cache: a sequence that may reuse them (a plain one) finds them.
    blocks = engine.block_manager
    assert blocks.allocate("probe", request.prompt_ids, True) == (len(request.prompt_ids) - 1) // 4 * 4 > 0
    blocks.free("probe")


@pytest.mark.parametrize("spec", ["eagle:{eagle},topk=1", "eagle:{eagle}", "medusa:{medusa}"])
def test_sampled_head_speculation_in_batch_runs_and_is_reproducible(stories_llm, head_dirs, spec):
    """Sampled chains (EAGLE draws from its q) and trees in the batch, with fixed K (adaptive K follows
    timings, which would change the random stream); exactness itself: tests/speculative/test_tree_exactness.py."""
    spec = SpecConfig.parse(spec.format(**head_dirs), 4, adaptive=False)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=3, max_tokens=30)

    def run():
        engine = Engine(stories_llm.runner, stories_llm.tokenizer, CacheConfig(), spec, stories_llm.proposers)
        outputs = engine.generate([Request("s", stories_llm.encode("Tom had a dog"), params)], n=2)[0]
        assert all(o.stats.drafted_tokens > 0 for o in outputs)
        return [o.token_ids for o in outputs]

    first = run()
    assert first == run() and len(first[0]) == 30 and first[0] != first[1]


class OracleFeatureProposer(OracleTreeProposer):
    """OracleTreeProposer for whichever request it serves (reference looked up by prompt), keeping the
    features the engine hands over."""

    wants_features = True
    feature_history = True  # every position's feature, so no prefix-cache reuse

    def __init__(self, references: dict[tuple[int, ...], list[int]], vocab_size: int, seed: int) -> None:
        super().__init__([], vocab_size, seed)
        self.references = references
        self.features: list[torch.Tensor] = []

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.reference = self.references[tuple(prompt_ids)]

    def add_features(self, features: torch.Tensor) -> None:
        self.features.append(features)


@pytest.fixture(scope="module", params=["fp32", "bf16"])
def llm(request, stories_llm):
    return stories_llm if request.param == "fp32" else LLM(STORIES_MODEL, tokenizer=STORIES_TOKENIZER, weights="bf16")


@pytest.mark.parametrize("k", [3, 8])  # trees of 4+ nodes take their logits row by row
def test_batched_tree_verification_finds_deep_paths_and_is_exact(llm, k):
    """The true continuation hidden at random depths and sibling positions of random trees: found
    (deep paths accepted), output equals plain greedy (so the accepted path's keys/values were moved
    into place), and every proposer holds the target's features f_0 .. f_{L-2} of its sequence."""
    requests = requests_of(llm)
    expected = [generate_one(llm.engine, r).token_ids for r in requests]
    references = {}  # prompt -> its longest greedy text (requests share prompts)
    for r, e in sorted(zip(requests, expected), key=lambda pair: len(pair[1])):
        references[tuple(r.prompt_ids)] = r.prompt_ids + e
    runner = llm.runner
    for config in CONFIGS:
        proposers, seeds = [], iter(range(1000))

        def make(spec):
            proposers.append(OracleFeatureProposer(references, llm.model.config.vocab_size, 100 * k + next(seeds)))
            return proposers[-1]

        fixed_k = SpecConfig("ngram", None, k, adaptive=False)  # only K matters: `make` builds the proposers
        engine = Engine(runner, llm.tokenizer, CacheConfig(**config), fixed_k, make)
        outputs = [o[0] for o in engine.generate(requests)]
        assert [o.token_ids for o in outputs] == expected, config
        assert engine.block_manager.num_used_blocks == 0
        assert sum(a >= 3 for p in proposers for a in p.accepted) > 0
        if config:
            assert engine.scheduler.num_preemptions > 0
        for p, r, o in zip(proposers, requests, outputs):
            full = (r.prompt_ids + o.token_ids)[:-1]  # the last token's feature is never needed
            received = torch.cat(p.features)  # [L - 1, hidden]
            reference = ContiguousPass(llm.model, len(full)).hidden(full, 0)
            assert received.shape == reference.shape
            if received.dtype == torch.float32:
                torch.testing.assert_close(received, reference, rtol=1e-4, atol=1e-4)
            else:  # bf16: a batched prefill rounds differently; each row is still the same vector
                error = (received.float() - reference.float()).norm(dim=-1) / reference.float().norm(dim=-1)
                assert float(error.max()) < 0.02


@pytest.mark.parametrize(
    "config",
    [
        {"kv_cache_dtype": "int8"},
        {"block_size": 8, "num_blocks": 64, "streaming_window": 32, "attention_sinks": 8},
    ],
    ids=["int8-cache", "streaming-window"],
)
def test_batched_trees_match_plain_batched_decoding(stories_llm, config):
    """With an int8 KV cache or a StreamingLLM window the output differs from the single engine's, but
    tree speculation must still reproduce the batched engine's own plain greedy output (moved path
    entries keep their int8 scales; a step's rows stay in its first row's block, so drafts never make
    the window slide earlier than plain decoding)."""
    requests = requests_of(stories_llm)
    runner = stories_llm.runner
    plain = Engine(runner, stories_llm.tokenizer, CacheConfig(**config))
    expected = [o[0].token_ids for o in plain.generate(requests)]
    references = {}
    for r, e in sorted(zip(requests, expected), key=lambda pair: len(pair[1])):
        references[tuple(r.prompt_ids)] = r.prompt_ids + e
    seeds = iter(range(1000))
    proposers = []

    def make(spec):
        proposers.append(OracleFeatureProposer(references, stories_llm.model.config.vocab_size, next(seeds)))
        return proposers[-1]

    fixed_k = SpecConfig("ngram", None, 6, adaptive=False)  # only K matters: `make` builds the proposers
    engine = Engine(runner, stories_llm.tokenizer, CacheConfig(**config), fixed_k, make)
    assert [o[0].token_ids for o in engine.generate(requests)] == expected
    assert sum(a >= 3 for p in proposers for a in p.accepted) > 0


@pytest.mark.slow
def test_default_model_batched_trained_heads_equal_plain_greedy(default_llm):
    """SmolLM2 (fp32) with the committed Medusa and EAGLE drafters (default options: trees), four
    concurrent chat requests of different lengths: plain greedy output, and drafts really accepted."""
    prompts = ["The capital of France is", "def fibonacci(n):", "Write a haiku about the sea.", "1, 2, 3, 4,"]
    requests = [
        Request(
            str(i),
            default_llm.tokenizer.encode_chat([{"role": "user", "content": p}]),
            SamplingParams(max_tokens=12 + 4 * i, ignore_eos=True),
        )
        for i, p in enumerate(prompts)
    ]
    expected = [generate_one(default_llm.engine, r).token_ids for r in requests]
    for spec in (f"medusa:{DRAFTERS}/medusa-smollm2-135m", f"eagle:{DRAFTERS}/eagle-smollm2-135m"):
        engine = Engine(
            default_llm.runner,
            default_llm.tokenizer,
            CacheConfig(kv_cache_mb=64),
            SpecConfig.parse(spec, 4, adaptive=False),
            default_llm.proposers,
        )
        outputs = [o[0] for o in engine.generate(requests)]
        assert [o.token_ids for o in outputs] == expected, spec
        assert sum(o.stats.accepted_tokens for o in outputs) > 0
