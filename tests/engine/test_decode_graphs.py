"""The CUDA-graph step's static rows (engine/decode_graphs.py), run without capture on the CPU: their
layout matches the eager path's rows, padded rows never reach real ones, the logits are the eager path's
bit for bit, and generation (plain, chains, trees) returns the same tokens. On a GPU only the capture and
the replay differ (tests/cuda/test_cuda_graphs.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from speclm import SamplingParams
from speclm.config import CacheConfig
from speclm.engine.decode_graphs import BUCKETS, FIELDS, MAX_ROWS, SHORT_TABLE, step_rows
from speclm.engine.engine import Engine
from speclm.engine.model_runner import ModelRunner
from speclm.models.attention import BatchEntry, PagedAttentionMetadata
from speclm.models.linear import row_chunked

pytestmark = pytest.mark.usefixtures("one_thread")

SCRATCH = 999


def entries() -> list[BatchEntry]:
    """A decode row, a verification chain and a token tree over scattered slots."""
    return [
        BatchEntry(tokens=[5], start=3, slots=[40, 41, 7, 9], num_logits=1),
        BatchEntry(tokens=[1, 2, 3], start=4, slots=[60, 61, 62, 63, 20, 21, 22], num_logits=3),
        BatchEntry(
            tokens=[4, 6, 8], start=2, slots=[80, 81, 82, 83, 84], num_logits=3, row_paths=[[0], [0, 1], [0, 2]]
        ),
    ]


def unpack(rows):
    b = rows.bucket
    flat = torch.tensor(rows.flat)
    vectors = flat[: FIELDS * b].view(FIELDS, b)
    return vectors, flat[FIELDS * b :].view(rows.table_count, rows.padded)


def test_static_rows_read_the_slots_the_eager_rows_read():
    rows = step_rows(entries(), SCRATCH, 64, 100)
    assert (rows.num_rows, rows.bucket, rows.max_position) == (7, BUCKETS[0], 6)
    (tokens, positions, writes, lengths, table_rows), table = unpack(rows)
    meta = PagedAttentionMetadata(entries())
    pooled = meta.pooled()
    assert tokens[:7].tolist() == [5, 1, 2, 3, 4, 6, 8]
    assert positions[:7].tolist() == [3, 4, 5, 6, 2, 3, 3]  # tree rows at start + depth
    assert torch.equal(writes[:7], meta.slot_mapping)
    assert torch.equal(lengths[:7], pooled.lengths)
    for i in range(7):  # row i reads the same pool slots, in the same order
        n = int(lengths[i])
        assert table[table_rows[i], :n].tolist() == pooled.slots[pooled.slot_rows[i], :n].tolist()
    # the padded rows write the scratch slot and read one valid key (row 0's first)
    assert set(tokens[7:].tolist()) == {0} and set(lengths[7:].tolist()) == {1}
    assert set(writes[7:].tolist()) == {SCRATCH} and set(table_rows[7:].tolist()) == {0}
    assert rows.table_count == 5  # the decode row's, the chain's, and one per tree row
    # with a table wider than SHORT_TABLE the rows are laid out as the short pass reads them: padded to it
    short = step_rows(entries(), SCRATCH, 4 * SHORT_TABLE, 100)
    assert short.short and short.padded == SHORT_TABLE and len(short.flat) == FIELDS * short.bucket + 5 * SHORT_TABLE
    short_vectors, short_table = unpack(short)
    assert torch.equal(short_vectors, torch.stack([tokens, positions, writes, lengths, table_rows]))
    assert torch.equal(short_table[:, : rows.width], table) and set(short_table[:, rows.width :].tolist()[0]) == {
        SCRATCH
    }


def test_static_rows_refuse_what_the_eager_path_must_run():
    prompt = BatchEntry(tokens=[1, 2, 3], start=0, slots=[0, 1, 2], num_logits=1)
    chunk = BatchEntry(tokens=[1, 2], start=5, slots=list(range(7)), num_logits=1)
    lazy_tree = BatchEntry(tokens=[1, 2], start=5, slots=list(range(7)), num_logits=0, row_paths=[[0], [0, 1]])
    for refused in (prompt, chunk, lazy_tree):
        assert step_rows([entries()[0], refused], SCRATCH, 64, 100) is None
    decode = [BatchEntry(tokens=[1], start=3, slots=[4 * i + j for j in range(4)], num_logits=1) for i in range(99)]
    assert step_rows(decode[: MAX_ROWS + 1], SCRATCH, 64, 100) is None  # too many rows
    assert step_rows(decode[:3], SCRATCH, 3, 100) is None  # a row longer than the table
    assert step_rows(decode[:3], SCRATCH, 64, 3) is None  # a position past the model's
    assert step_rows(decode[:3], SCRATCH, 64, 100).bucket == BUCKETS[0]
    assert step_rows(decode[: BUCKETS[0] + 1], SCRATCH, 64, 100).bucket == BUCKETS[1]


def test_row_chunked_calls_its_linear_on_fixed_rows_only():
    calls = []
    weight = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))

    def linear(x):
        calls.append(tuple(x.shape))
        return x @ weight.T

    op = row_chunked(linear, 4)
    for n in (1, 3, 4, 5, 9):
        x = torch.randn(n, 3)
        torch.testing.assert_close(op(x), x @ weight.T)
    assert set(calls) == {(4, 3)}
    assert op(torch.randn(2, 2, 3)).shape == (2, 2, 5)


@pytest.fixture(scope="module")
def static_llm(stories_llm):
    """stories260K with the static-row step on (eager: no capture on the CPU)."""
    llm = stories_llm.with_engine()
    llm.runner = ModelRunner(llm.model, decode_graphs="eager")
    llm._set_spec(None)
    return llm


def graphs_of(llm):
    return llm.runner.decode_graphs(llm.engine.cache)


def test_static_step_logits_equal_the_eager_step_bit_for_bit(stories_llm, static_llm):
    cache = static_llm.engine.cache
    eager_runner = ModelRunner(stories_llm.model, decode_graphs="off")
    g = torch.Generator().manual_seed(0)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=g))
    cache.values.copy_(torch.randn(cache.values.shape, generator=g))
    # a row longer than SHORT_TABLE keys: the pass reads the whole table
    long = [BatchEntry(tokens=[5], start=SHORT_TABLE + 40, slots=list(range(100, SHORT_TABLE + 141)), num_logits=1)]
    steps = [entries(), entries()[:1], entries()[1:2], long, entries() + long]
    graphs = graphs_of(static_llm)
    columns = [step_rows(step, SCRATCH, graphs.width, graphs.positions).columns for step in steps]
    assert columns == [SHORT_TABLE] * 3 + [graphs.width] * 2
    for step in steps:
        out = static_llm.runner.forward(cache, step)
        expected, expected_hidden, _ = eager_runner.forward_batch(cache, step)
        assert torch.equal(out.logits, expected) and torch.equal(out.hidden, expected_hidden)
        assert torch.equal(out.argmax, expected.argmax(-1))  # the greedy choice the static pass takes itself
    assert graphs.steps == len(steps)


PROMPTS = ["Once upon a time", "Tom had a red ball. Tom had a red ball. Tom", "The cat sat on the"]
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


@pytest.mark.parametrize("spec", [None, "ngram", "lookahead:3,2,2"])
def test_static_steps_generate_the_eager_tokens(stories_llm, static_llm, spec):
    expected = [o.token_ids for o in stories_llm.with_spec(spec, 4, adaptive=False).generate(PROMPTS, GREEDY)]
    llm = static_llm.with_spec(spec, 4, adaptive=False)
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == expected
    assert graphs_of(llm).steps > 0


def test_static_steps_of_a_sliding_window_model_generate_the_eager_tokens(tmp_path):
    """gemma3's local layers (window 8, passed by the prompt and the tokens after it) from static rows."""
    transformers = pytest.importorskip("transformers")
    from speclm import LLM
    from tests.models.hf_tiny import tiny_hf_model
    from tests.models.test_families import GEMMA3, _word_tokenizer

    hf_model = tiny_hf_model(transformers.Gemma3TextConfig, **GEMMA3)
    hf_model.save_pretrained(tmp_path)
    _word_tokenizer(tmp_path, hf_model.config.vocab_size)
    llm = LLM(str(tmp_path), tokenizer=str(tmp_path), weights="fp32", threads=1)
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [3, 4, 5]]
    for spec in (None, "ngram"):
        expected = [o.token_ids for o in llm.with_spec(spec, 4, adaptive=False).generate(prompts, GREEDY)]
        # (decode graphs serve one pool for every layer: sliding_window_pool=False; a pool per layer kind
        # runs its steps eagerly)
        static = llm.with_spec(spec, 4, adaptive=False).with_engine(
            dataclasses.replace(llm.cache_config, sliding_window_pool=False)
        )
        static.runner = ModelRunner(static.model, decode_graphs="eager")
        static._set_spec(static.spec)
        assert [o.token_ids for o in static.generate(prompts, GREEDY)] == expected
        assert graphs_of(static).steps > 0


def test_a_step_started_ahead_is_used_when_predicted_and_dropped_when_not(stories_llm, static_llm):
    """forward(ahead=True) starts the next step (each row's argmax at the next slot of its block); the step
    that comes is served from it when it is that step, else run afresh, with the eager step's logits both ways."""
    cache, runner, graphs = static_llm.engine.cache, static_llm.runner, graphs_of(static_llm)
    eager_runner = ModelRunner(stories_llm.model, decode_graphs="off")
    g = torch.Generator().manual_seed(1)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=g))
    cache.values.copy_(torch.randn(cache.values.shape, generator=g))
    rows = [BatchEntry(tokens=[5], start=3, slots=[40, 41, 7, 9], num_logits=1)]
    rows.append(BatchEntry(tokens=[8], start=5, slots=[60, 61, 62, 63, 20, 21], num_logits=1))

    def following(step, tokens):
        return [BatchEntry([t], e.start + 1, e.slots + [e.slots[-1] + 1], 1) for e, t in zip(step, tokens)]

    def check(step, ahead):
        out = runner.forward(cache, step, ahead=ahead)
        expected, _, _ = eager_runner.forward_batch(cache, step)
        assert torch.equal(out.logits, expected)
        return out.argmax.tolist()

    hits = graphs.ahead_hits
    chosen = check(rows, ahead=True)
    chosen = check(following(rows, chosen), ahead=True)  # predicted: served from the step started ahead
    assert graphs.ahead_hits == hits + 1
    step = following(following(rows, chosen), [(t + 1) % 512 for t in chosen])  # not the argmax: dropped
    check(step, ahead=True)
    assert graphs.ahead_hits == hits + 1
    moved = [BatchEntry([t], e.start + 1, e.slots + [100 + i], 1) for i, (e, t) in enumerate(zip(step, chosen))]
    check(moved, ahead=False)  # another slot than predicted: dropped too
    assert graphs.ahead_hits == hits + 1 and graphs.pending is None
    # a row whose next slot starts a block is never run ahead (the block may be new or shared)
    edge = [BatchEntry(tokens=[5], start=3, slots=[40, 41, 42, cache.block_size * 3 - 1], num_logits=1)]
    check(edge, ahead=True)
    assert graphs.pending is None


def test_greedy_decoding_runs_each_step_ahead_and_keeps_the_eager_tokens(stories_llm, static_llm):
    graphs = graphs_of(static_llm)
    hits = graphs.ahead_hits
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = [o.token_ids for o in stories_llm.generate(PROMPTS, params)]
    assert [o.token_ids for o in static_llm.generate(PROMPTS, params)] == expected
    # every decode step came from a step run ahead but the first and those where a row's next slot starts a
    # block (each row's every 16th position)
    assert graphs.ahead_hits - hits >= 40 - 1 - len(PROMPTS) * (40 // 16 + 1)
    # a sampled request beside greedy ones: no step runs ahead while it is in the batch, and the greedy
    # requests' tokens stay the eager ones
    sampled = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    requests = [static_llm._request(static_llm.encode(p), params) for p in PROMPTS[:2]]
    requests.append(static_llm._request(static_llm.encode(PROMPTS[2]), sampled))
    outputs = static_llm.engine.generate(requests)
    assert [o[0].token_ids for o in outputs[:2]] == expected[:2]
    eager_sampled = stories_llm.engine.generate([stories_llm._request(stories_llm.encode(PROMPTS[2]), sampled)])
    assert outputs[2][0].token_ids == eager_sampled[0][0].token_ids


def test_steps_run_ahead_keep_batch_invariance_under_preemption_and_prefix_hits(stories_llm):
    """Many greedy requests at once through the static rows with steps run ahead (chunked prompts, prefix-cache
    hits, preemption by recompute in a small pool, requests ending at different steps: predictions that fail)
    give each request's tokens alone: a dropped pass's keys never reach a row that reads them."""
    from tests.engine.test_batch_invariance import LOADS, requests, solo

    runner = ModelRunner(stories_llm.model, decode_graphs="eager")
    reqs = requests(stories_llm, 24, 24)
    expected = solo(stories_llm, {}, reqs)
    for load in ("chunked-prefill", "preemption"):
        engine = Engine(runner, stories_llm.tokenizer, CacheConfig(**LOADS[load]))
        assert [o[0].token_ids for o in engine.generate(requests(stories_llm, 24, 24))] == expected
        graphs = runner.decode_graphs(engine.cache)
        assert graphs.ahead_hits > 0 and graphs.steps > graphs.ahead_hits  # run ahead, and some not predicted
        if load == "preemption":
            assert engine.scheduler.num_preemptions > 0
        else:
            assert engine.block_manager.stats.hit_tokens > 0
