"""Continuous batching: waiting/running queues, a token budget per step, chunked prefill, preemption.

Integers only (no tensors): each step picks which sequences run how many new tokens, asks the
BlockManager for their cache slots, and when blocks run out preempts the newest running sequence
(its blocks are freed; it is recomputed from its prompt and committed tokens later, so no token is
lost or repeated).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from speclm.engine.sequence import Sequence
from speclm.kv.block_manager import BlockManager


@dataclass
class ScheduledChunk:
    """Run tokens (seq.token_ids + draft_tokens)[start : start + num_tokens]; `start` equals
    seq.num_computed; the last len(draft_tokens) of them are the drafts the scheduler granted (the
    first ones of the sequence's proposal)."""

    seq: Sequence
    start: int
    num_tokens: int
    draft_tokens: list[int] = field(default_factory=list)

    @property
    def num_drafts(self) -> int:
        return len(self.draft_tokens)

    @property
    def tokens(self) -> list[int]:
        """The token ids this chunk runs."""
        return (self.seq.token_ids + self.draft_tokens)[self.start : self.start + self.num_tokens]

    @property
    def completes(self) -> bool:
        """True when this chunk reaches the sequence's last token, so its logits pick the next token."""
        return self.start + self.num_tokens == self.seq.num_tokens + self.num_drafts


@dataclass
class SchedulerOutput:
    """What one engine step runs, and the block copies (copy-on-write) to do before it."""

    chunks: list[ScheduledChunk] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def scheduled_spec_decode_tokens(self) -> dict[str, list[int]]:
        """seq_id -> the draft tokens granted to it this step (sequences with drafts only)."""
        return {c.seq.seq_id: c.draft_tokens for c in self.chunks if c.draft_tokens}


class Scheduler:
    """FIFO continuous batching under `max_num_batched_tokens` per step and `max_num_seqs` running."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int = 32, max_num_batched_tokens: int = 256) -> None:
        if max_num_seqs < 1 or max_num_batched_tokens < 1:
            raise ValueError(
                f"need max_num_seqs >= 1 and max_num_batched_tokens >= 1, got {max_num_seqs}, {max_num_batched_tokens}"
            )
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self._draft_turn = 0

    @property
    def capacity_tokens(self) -> int:
        return self.blocks.num_blocks * self.blocks.block_size

    def add(self, seq: Sequence) -> None:
        needed = seq.max_total_tokens if seq.max_cache_tokens is None else seq.max_cache_tokens
        if self.blocks.window_blocks is None and needed > self.capacity_tokens:
            raise ValueError(f"sequence needs up to {needed} tokens but the KV cache holds {self.capacity_tokens}")
        self.waiting.append(seq)

    def add_running(self, seq: Sequence) -> None:
        """Put a sequence that already owns blocks (a fork) straight into the running queue."""
        self.running.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def finish(self, seq: Sequence) -> None:
        """Drop a finished or aborted sequence and free its blocks."""
        seq.finished = True
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.free(seq.seq_id)

    def schedule(self, drafts: dict[str, list[int]] | None = None) -> SchedulerOutput:
        """Pick this step's work: running sequences first (oldest first), then admit waiting ones,
        then grant what is left of the budget to speculative drafts (`drafts`: seq_id -> the draft
        tokens proposed for it; a sequence is granted a prefix of them).

        Drafts come last so that speculation never changes how prompts are chunked: a prefill's
        arithmetic depends on its chunks, and with bf16 activations a different chunking could flip
        a greedy near-tie, making speculative output differ from plain decoding's."""
        out = SchedulerOutput()
        budget = self.max_num_batched_tokens
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_uncomputed, budget)
            copies = self.blocks.ensure_slots(seq.seq_id, seq.num_computed, seq.num_computed + n)
            if copies is None:
                # Out of blocks: recompute the newest running sequence later (maybe this one).
                victim = self.running[-1]
                self._preempt(victim, out)
                if victim is seq:
                    break
                continue
            out.copies += copies
            out.chunks.append(ScheduledChunk(seq, seq.num_computed, n))
            budget -= n
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs and not out.preempted:
            seq = self.waiting[0]
            if not self.blocks.has(seq.seq_id):
                seq.num_computed = self.blocks.allocate(seq.seq_id, seq.token_ids, seq.reuse_prefix)
            n = min(seq.num_uncomputed, budget)
            copies = self.blocks.ensure_slots(seq.seq_id, seq.num_computed, seq.num_computed + n)
            if copies is None:
                self.blocks.free(seq.seq_id)  # give the prefix blocks back; try again next step
                seq.num_computed = 0
                break
            self.waiting.popleft()
            self.running.append(seq)
            out.copies += copies
            out.chunks.append(ScheduledChunk(seq, seq.num_computed, n))
            budget -= n
        # Drafts ride along with a sequence's last token, as the budget allows; when it runs short,
        # a rotating start lets every sequence have its turn.
        drafts = drafts or {}
        turn = self._draft_turn % len(out.chunks) if out.chunks else 0
        self._draft_turn += 1
        for chunk in out.chunks[turn:] + out.chunks[:turn]:
            granted = min(len(drafts.get(chunk.seq.seq_id, ())), budget)
            if not granted or not chunk.completes:
                continue
            end = chunk.start + chunk.num_tokens
            copies = self.blocks.ensure_slots(chunk.seq.seq_id, end, end + granted, first_row=chunk.start)
            if copies is None:  # no free block for them: this step runs without drafts
                continue
            out.copies += copies
            chunk.num_tokens += granted
            chunk.draft_tokens = drafts[chunk.seq.seq_id][:granted]
            budget -= granted
        return out

    def _preempt(self, seq: Sequence, out: SchedulerOutput) -> None:
        self.running.remove(seq)
        self.blocks.free(seq.seq_id)
        seq.num_computed = 0
        seq.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(seq)
        out.preempted.append(seq)
