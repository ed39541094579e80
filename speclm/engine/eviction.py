"""The engine's side of token-granular KV eviction (H2O, SnapKV): attention weights of committed rows in,
compactions of the paged cache out. The policies themselves live in speclm/kv/eviction.py.

Only committed tokens count: a step's rows are scored after verification (rejected drafts never
are), and evictions happen before a step, when the entries already committed reach the budget. Draft
rows are granted only within the room left before that point, so a speculative run evicts at the same
tokens, with the same scores, as plain decoding: its output is plain decoding's, token for token.
"""

from __future__ import annotations

import torch

from speclm.config import CacheConfig
from speclm.engine.request import SequenceOutput
from speclm.engine.sequence import Sequence
from speclm.engine.sequence_table import SequenceTable
from speclm.kv.block_manager import BlockManager
from speclm.kv.eviction import EvictionPlan, SequenceEviction
from speclm.kv.paged_cache import PagedKVCache
from speclm.models.attention import attention_weights
from speclm.models.config import ModelConfig


class KVEvictor:
    """Keeps each evicting sequence within its budget of KV entries (per layer and KV head)."""

    def __init__(
        self, config: CacheConfig, model_config: ModelConfig, cache: PagedKVCache, block_manager: BlockManager
    ) -> None:
        assert config.token_eviction, config.kv_eviction
        self.config, self.cache, self.block_manager = config, cache, block_manager
        self.shape = (model_config.num_layers, model_config.num_kv_heads)

    def new_sequence(self, seq: Sequence) -> SequenceEviction:
        """The eviction state of a new sequence (its budget: of the seq.max_total_tokens it may reach).
        Sets seq.max_cache_tokens: the pool must hold its prompt (prefilled whole) and its budget."""
        budget, prompt_tokens = self.config.budget_tokens(seq.max_total_tokens), len(seq.prompt_ids)
        sinks = self.config.attention_sinks
        plan = EvictionPlan.of(
            self.config.kv_eviction, budget, self.config.eviction_batch(budget), sinks, prompt_tokens
        )
        seq.max_cache_tokens = max(prompt_tokens, budget)
        return SequenceEviction(plan, *self.shape)

    def evict_due(self, running: list[Sequence], table: SequenceTable) -> list[SequenceOutput]:
        """Before a step: cut each decoding sequence whose committed entries reached its budget (a
        prompt is computed whole, then cut). One whose eviction raised fails its request alone."""
        failed = []
        for seq in list(running):
            state = table.get(seq.seq_id)
            if state is None or state.eviction is None or seq.num_uncomputed != 1:
                continue
            try:
                self.evict(seq.seq_id, state.eviction, seq.num_computed)
            except Exception as e:
                failed.append(table.fail(state, e))
        return failed

    def evict(self, seq_id: str, state: SequenceEviction, next_position: int) -> None:
        """Before a step that computes next_position: cut a sequence at its budget down to plan.keep entries."""
        if not state.needs_eviction():
            return
        held = state.held
        src = self.block_manager.slot_ids(seq_id, 0, next_position)
        assert len(src) == held, (len(src), held)  # the state and the block table agree on the entries
        kept = state.select(next_position)
        self.block_manager.compact(seq_id, held, state.held)
        self.cache.compact(src, kept, self.block_manager.slot_ids(seq_id, 0, next_position))  # now the kept entries

    def observe(
        self, state: SequenceEviction, start: int, slots: list[int], queries: list[torch.Tensor], rows: list[int]
    ) -> None:
        """Record a step's committed rows of one sequence: `rows` (in order) of its chunk, whose tokens sit
        at positions start.. and whose keys are now the entries after the held ones. `slots` is the
        chunk's slot list (held entries, then one per row); `queries` its rows' queries per layer
        [heads, chunk rows, head_dim]. Adds the entries, and the weights the policy wants."""
        if start == 0:
            state.reset()  # a (re)computation from the first token: a preempted sequence starts over
        held, n = state.held, len(rows)
        state.append(list(range(start, start + n)))
        wanted = [j for j in range(n) if state.wants_weights(start + j)]
        if not wanted:
            return
        width = held + wanted[-1] + 1
        keys = self.cache.gather_keys(slots[:width])  # [layers, kv_heads, width, head_dim]
        if len(wanted) == n and n > 1 and rows == list(range(n)):
            # A prompt chunk: its rows in one pass per layer (plain and speculative runs chunk prompts alike).
            lengths = [held + j + 1 for j in range(n)]
            weights = [attention_weights(q[:, :n], k, lengths).sum(1) for q, k in zip(queries, keys)]
            state.add_weights(torch.stack(weights).cpu())
            return
        queries = torch.stack(queries)  # [layers, heads, chunk rows, head_dim]
        for j in wanted:  # one row at a time, in order: the arithmetic of plain decoding's step for it
            length = held + j + 1
            row = queries[:, :, rows[j] : rows[j] + 1]  # [layers, heads, 1, head_dim]
            state.add_weights(attention_weights(row, keys[:, :, :length], [length])[:, :, 0].cpu())


def draft_room(
    seq: Sequence, max_total_tokens: int, block_manager: BlockManager, eviction: SequenceEviction | None
) -> int:
    """How many draft rows a sequence can take this step. Rows may run past its final length (a tree's
    nodes outnumber its depth, which the tokens still wanted bound), not past the context, and never
    into a row that would need an eviction plain decoding would not make there."""
    room = max_total_tokens - seq.num_tokens - 1
    if eviction is not None:  # H2O / SnapKV: every row fits before the budget
        return min(room, eviction.room() - 1)
    if not block_manager.has(seq.seq_id):  # a new sequence: no blocks, no window yet
        return room
    window_end = block_manager.eviction_free_end(seq.seq_id)
    if window_end is not None:
        # A full StreamingLLM window evicts a block for every new one. Rows of this step stay before
        # that point, or else in the block of its first row (where plain decoding of that row
        # allocates, and so evicts, the same way): a row past it would make the window slide early
        # and change what the earlier rows attend to.
        first, bs = seq.num_tokens - 1, block_manager.block_size
        room = min(room, max(window_end, (first // bs + 1) * bs) - 1 - first)
    return room
