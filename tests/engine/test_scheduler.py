"""Scheduler (integers only): token budget, chunked prefill, admission, preemption order."""

from speclm.engine.scheduler import Scheduler, Sequence
from speclm.kv.block_manager import BlockManager


def run_step(scheduler, drafts=None):
    """Pretend the model ran: advance num_computed and append a token to completed sequences (drafts
    all rejected). Returns the scheduler's output and its chunks as (seq_id, start, num_tokens, completes)."""
    out = scheduler.schedule(drafts)
    rows = [(c.seq.seq_id, c.start, c.num_tokens, c.completes) for c in out.chunks]
    for chunk in out.chunks:
        chunk.seq.num_computed += chunk.num_tokens - chunk.num_drafts
        if chunk.completes:
            chunk.seq.output_ids.append(0)
    return out, rows


def test_chunked_prefill_under_token_budget():
    scheduler = Scheduler(BlockManager(64, 4, enable_prefix_caching=False), max_num_seqs=4, max_num_batched_tokens=8)
    a, b = Sequence("a", list(range(10)), 20), Sequence("b", list(range(3)), 20)
    scheduler.add(a)
    scheduler.add(b)
    out, rows = run_step(scheduler)
    assert [(c.seq.seq_id, c.start, c.num_tokens) for c in out.chunks] == [("a", 0, 8)]
    out, rows = run_step(scheduler)
    # a finishes its prompt (2 tokens), b's whole prompt fits in the rest of the budget
    assert rows == [("a", 8, 2, True), ("b", 0, 3, True)]
    out, rows = run_step(scheduler)
    assert [(c.seq.seq_id, c.start, c.num_tokens) for c in out.chunks] == [("a", 10, 1), ("b", 3, 1)]


def test_max_num_seqs_limits_admission():
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for name in "abc":
        scheduler.add(Sequence(name, [1, 2], 10))
    out, rows = run_step(scheduler)
    assert [c.seq.seq_id for c in out.chunks] == ["a", "b"] and len(scheduler.waiting) == 1
    scheduler.finish(scheduler.running[0])
    out, rows = run_step(scheduler)
    assert [c.seq.seq_id for c in out.chunks] == ["b", "c"]


def test_preempts_newest_when_blocks_run_out_and_recomputes_it():
    blocks = BlockManager(3, 2, enable_prefix_caching=False)
    scheduler = Scheduler(blocks, max_num_seqs=4, max_num_batched_tokens=100)
    a, b = Sequence("a", [1, 2, 3], 6), Sequence("b", [4, 5], 6)
    scheduler.add(a)
    scheduler.add(b)
    run_step(scheduler)  # a: 2 blocks, b: 1 block; pool empty
    assert blocks.num_free_blocks == 0
    out, rows = run_step(scheduler)  # a fits in its block; b needs a new block: b is preempted
    assert [c.seq.seq_id for c in out.chunks] == ["a"] and out.preempted == [b]
    assert b.num_computed == 0 and b.output_ids == [0] and list(scheduler.waiting) == [b]
    scheduler.finish(a)
    out, rows = run_step(scheduler)  # b comes back: prompt and its committed token are recomputed
    assert [(c.seq.seq_id, c.start, c.num_tokens) for c in out.chunks] == [("b", 0, 3)]
    assert blocks.num_used_blocks == 2


def test_drafts_ride_with_the_last_token_as_the_budget_allows():
    """The scheduler grants a prefix of each sequence's draft tokens (never to a prompt chunk that does
    not complete), and its output names the granted tokens per sequence."""
    scheduler = Scheduler(BlockManager(64, 4), max_num_seqs=4, max_num_batched_tokens=6)
    a, b = Sequence("a", [1, 2, 3], 20), Sequence("b", list(range(10)), 20)
    scheduler.add(a)
    run_step(scheduler)  # a's prompt
    scheduler.add(b)
    out, rows = run_step(scheduler, {"a": [7, 8, 9, 10, 11, 12], "b": [5]})
    # a's pending token (1) and b's first prompt chunk (5) leave no budget for drafts; nor the next step
    assert rows == [("a", 3, 1, True), ("b", 0, 5, False)] and out.scheduled_spec_decode_tokens == {}
    out, rows = run_step(scheduler, {"a": [7, 8, 9, 10, 11, 12]})
    assert rows == [("a", 4, 1, True), ("b", 5, 5, True)] and out.scheduled_spec_decode_tokens == {}
    out, rows = run_step(scheduler, {"a": [7, 8, 9, 10, 11, 12]})
    assert rows == [("a", 5, 5, True), ("b", 10, 1, True)]  # both decode: 4 of the 6 tokens left go to a
    assert out.scheduled_spec_decode_tokens == {"a": [7, 8, 9, 10]}
    assert out.chunks[0].draft_tokens == [7, 8, 9, 10] and out.chunks[0].num_drafts == 4
