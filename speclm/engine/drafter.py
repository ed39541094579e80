"""Before a step is scheduled: each speculating sequence drafts the tokens it asks the scheduler to verify."""

from __future__ import annotations

from speclm.engine.eviction import draft_room
from speclm.engine.request import SequenceOutput
from speclm.engine.scheduler import Scheduler
from speclm.engine.sequence_table import SequenceTable
from speclm.kv.block_manager import BlockManager


class Drafter:
    """Proposes drafts for the sequences whose next step runs their pending token alone (decoding, or a
    new one-token prompt), unless the batch is big: with more than `spec_max_batch` sequences in the step
    (running, and waiting ones it may admit) the weights are busy already and extra verification rows (and
    a draft model's passes, one sequence at a time) stop paying. A prompt waiting to be read counts: its
    chunk takes the step's token budget before drafts do, so a lone decoding sequence's drafts would be
    made and then not granted (on the real pair, a round of 4 requests lost ~2.5 s of draft passes so)."""

    def __init__(
        self,
        scheduler: Scheduler,
        block_manager: BlockManager,
        table: SequenceTable,
        max_total_tokens: int,
        spec_max_batch: int,
    ) -> None:
        self.scheduler, self.block_manager, self.table = scheduler, block_manager, table
        self.max_total_tokens, self.spec_max_batch = max_total_tokens, spec_max_batch

    def propose(self, failed: list[SequenceOutput]) -> dict[str, list[int]]:
        """seq_id -> its draft tokens (sequences with drafts only); a sequence whose proposer raised
        fails its request alone, with an output appended to `failed`."""
        running, waiting = self.scheduler.running, self.scheduler.waiting
        admissible = min(len(waiting), max(0, self.scheduler.max_num_seqs - len(running)))
        if len(running) + admissible > self.spec_max_batch:
            return {}
        # the running sequences and the new ones whose prompt the prefix cache holds but for the last token
        candidates = list(running) + [s for s in waiting if s.num_uncomputed == 1]
        drafts = {}
        for seq in candidates:
            state = self.table.get(seq.seq_id)
            if state is None or state.speculation is None or seq.num_uncomputed != 1:
                continue  # (a state is gone when its request failed earlier in this loop)
            try:
                tokens = state.speculation.propose(
                    seq.token_ids,
                    state.tracker.remaining - 1,
                    draft_room(seq, self.max_total_tokens, self.block_manager, state.eviction),
                    state.request.params,
                    state.generator,
                    state.matcher,
                )
            except Exception as e:
                failed.append(self.table.fail(state, e))
                continue
            if tokens:
                drafts[seq.seq_id] = tokens
        return drafts
