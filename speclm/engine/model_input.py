"""The model runner's input for a scheduled step: per chunk its tokens, positions, cache slots and logit rows."""

from __future__ import annotations

from speclm.engine.scheduler import ScheduledChunk, SchedulerOutput
from speclm.engine.sequence_table import SequenceTable
from speclm.kv.block_manager import BlockManager
from speclm.models.attention import BatchEntry


def batch_entries(plan: SchedulerOutput, block_manager: BlockManager, table: SequenceTable) -> list[BatchEntry]:
    """One BatchEntry per scheduled chunk, in order."""
    return [_entry(chunk, block_manager, table) for chunk in plan.chunks]


def _entry(chunk: ScheduledChunk, block_manager: BlockManager, table: SequenceTable) -> BatchEntry:
    """A chunk's tokens at its positions and slots. Its logit rows: none for a prompt chunk that does
    not complete, else the pending token's and one per draft, except for a big tree whose verifier's
    walk asks for its path's rows only (the draft tree's shape comes from the sequence's speculation)."""
    seq, k, end = chunk.seq, chunk.num_drafts, chunk.start + chunk.num_tokens
    row_paths, num_logits = None, 1 + k if chunk.completes else 0
    if k:
        speculation = table.get(seq.seq_id).speculation
        tree = speculation.tree(k)
        row_paths = None if tree.is_chain() else tree.row_paths()
        if speculation.lazy_logits(tree):
            num_logits = 0
    slots, local_slots = block_manager.slot_ids(seq.seq_id, 0, end), block_manager.local_slot_ids(seq.seq_id, 0, end)
    return BatchEntry(chunk.tokens, chunk.start, slots, num_logits, row_paths, local_slots)
