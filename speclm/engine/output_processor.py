"""After the forward: per scheduled chunk, sample or verify, commit, check the stop conditions, time the step.

A prompt chunk that does not complete commits nothing (its rows' next tokens are prompt tokens). A
chunk that completes commits a plain draw from its pending token's row, or, with drafts, what the
rejection sampler accepted plus a recovered or bonus token; the samples 1..n-1 of a request fork off
its prompt here. Feature proposers get the features of every row whose next token is committed.
"""

from __future__ import annotations

import time

import torch

from speclm.engine.eviction import KVEvictor
from speclm.engine.model_runner import ModelOutput, ModelRunner
from speclm.engine.request import RequestOutput, SequenceOutput, TokenLogprob
from speclm.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from speclm.engine.sequence import SequenceState
from speclm.engine.sequence_table import SequenceTable
from speclm.kv.block_manager import BlockManager
from speclm.kv.paged_cache import PagedKVCache
from speclm.models.attention import BatchEntry
from speclm.sample.masked import token_logprobs
from speclm.sample.rejection import RejectionSampler
from speclm.sample.row_logits import RowLogits


class OutputProcessor:
    """Turns one forward's rows into committed tokens and SequenceOutputs."""

    def __init__(
        self,
        runner: ModelRunner,
        cache: PagedKVCache,
        block_manager: BlockManager,
        scheduler: Scheduler,
        table: SequenceTable,
        evictor: KVEvictor | None,
    ) -> None:
        self.runner, self.cache, self.block_manager = runner, cache, block_manager
        self.scheduler, self.table, self.evictor = scheduler, table, evictor
        self.verifier = RejectionSampler()

    def process(self, plan: SchedulerOutput, entries: list[BatchEntry], out: ModelOutput) -> list[SequenceOutput]:
        """Every chunk's outputs, in order; a chunk whose own work raises fails its request alone."""
        # Adaptive K charges a sequence its share (by rows) of the step: charged the whole step, it
        # would pay for the other sequences' drafts too, and none alone would see drafting fail to pay.
        seconds_per_row = out.seconds / plan.num_tokens
        outputs: list[SequenceOutput] = []
        row, offset = 0, 0
        for chunk, entry in zip(plan.chunks, entries):
            end = row + entry.num_logits
            logits = out.logits[row:end]  # [num_logits, vocab]
            argmax = out.argmax[row:end] if out.argmax is not None else None
            computed = RowLogits.computed(logits, argmax, lambda row=row, end=end: out.host_logits()[row:end])
            features = out.hidden[offset : offset + chunk.num_tokens]  # [num_tokens, hidden]
            queries = [q[:, offset : offset + chunk.num_tokens] for q in out.queries] if out.queries else None
            row, offset = end, offset + chunk.num_tokens
            state = self.table.get(chunk.seq.seq_id)
            if state is None:  # its request failed earlier in this step
                continue
            try:
                outputs += self._chunk(state, chunk, entry, computed, features, seconds_per_row, queries)
            except Exception as e:  # this sequence's own work broke: fail its request only
                outputs.append(self.table.fail(state, e))
        return outputs

    def _chunk(
        self,
        state: SequenceState,
        chunk: ScheduledChunk,
        entry: BatchEntry,
        computed: RowLogits,
        features: torch.Tensor,
        seconds_per_row: float,
        queries: list[torch.Tensor] | None,
    ) -> list[SequenceOutput]:
        """Commit what the chunk decided for its sequence (and the forks of a prompt): `computed`, the rows
        the forward computed for it (none for a big tree). `queries` (evicting engines): its rows' queries
        per layer."""
        seq, k = chunk.seq, chunk.num_drafts
        state.stats.target_forwards += 1
        seq.num_computed += chunk.num_tokens - k  # accepted drafts are added after verification
        if state.eviction is not None and k == 0:  # every row is committed
            self.evictor.observe(state.eviction, chunk.start, entry.slots, queries, list(range(chunk.num_tokens)))
        if not chunk.completes:  # a prompt chunk: every row's next token is a prompt token
            self.block_manager.mark_computed(seq.seq_id, seq.token_ids, seq.num_computed)
            for s in [state, *state.forks]:
                _hand_features(s, chunk.start, features)
            return []
        # A big tree's logits: its walk computes its path's rows only.
        rows = computed if entry.num_logits else self.runner.row_logits(features)
        outputs = [self._fork(state, child, chunk, rows, features[: chunk.num_tokens - k]) for child in state.forks]
        state.forks = []
        if k == 0:
            decoding = chunk.num_tokens == 1  # the pending token alone, not the end of a prompt
            if decoding:
                state.stats.target_seconds += seconds_per_row
                if state.speculation is not None:
                    state.speculation.record_plain_step(seconds_per_row)
            _hand_features(state, chunk.start, features)
            token = self.draw(state, rows)
            return outputs + [self._commit(state, [token], decoding=decoding, logprobs=_logprobs(state, rows, [token]))]
        return outputs + [self._verify(state, chunk, entry, rows, features, seconds_per_row, queries)]

    def _fork(
        self, state: SequenceState, child: SequenceState, chunk: ScheduledChunk, rows: RowLogits, features: torch.Tensor
    ) -> SequenceOutput:
        """Sample i of n starts from the prompt's blocks (copy-on-write) with a draw of its own."""
        self.block_manager.fork(chunk.seq.seq_id, child.seq.seq_id)
        child.seq.num_computed = chunk.seq.num_computed
        child.eviction = state.eviction.copy() if state.eviction is not None else None
        child.stats.target_forwards += 1  # the prompt's passes are shared
        self.scheduler.add_running(child.seq)
        _hand_features(child, chunk.start, features)  # (not the parent's drafts)
        token = self.draw(child, rows)
        return self._commit(child, [token], decoding=False, logprobs=_logprobs(child, rows, [token]))

    def draw(self, state: SequenceState, rows: RowLogits) -> int:
        """A sequence's next token without drafts: a plain draw from its pending token's row (greedy:
        the argmax), under its grammar if it has one. `speclm bench kv` replaces it to force a given
        text's tokens."""
        params = state.request.params
        if params.penalized:
            rows = rows.penalized(params, state.seq.prompt_ids, state.seq.output_ids, [[]])
        if state.matcher is not None:
            with state.matcher.timed():
                rows = rows.masked(state.matcher.allowed_mask()[None])
        return rows.sample_first(state.request.params, state.generator)

    def _verify(
        self,
        state: SequenceState,
        chunk: ScheduledChunk,
        entry: BatchEntry,
        rows: RowLogits,
        features: torch.Tensor,
        seconds_per_row: float,
        queries: list[torch.Tensor] | None,
    ) -> SequenceOutput:
        """The granted drafts against their rows: commit the accepted path and a recovered or bonus token."""
        seq, speculation = chunk.seq, state.speculation
        result, tree = speculation.verify(
            self.verifier,
            rows,
            chunk.draft_tokens,
            state.request.params,
            state.generator,
            state.matcher,
            (seq.prompt_ids, seq.output_ids),
        )
        kept = [0] + [i + 1 for i in result.path]  # rows whose next tokens are now committed
        if not tree.is_chain():  # row r sits at the slot of position start + r: the path moves after the root
            end, moves = chunk.start + chunk.num_tokens, []
            for slots in (self.block_manager.slot_ids, self.block_manager.local_slot_ids):  # (a local pool's too)
                new_slots = slots(seq.seq_id, chunk.start, end)
                if new_slots is not None:
                    moves += [[new_slots[r] for r in kept[1:]], new_slots[1 : len(kept)]]
            self.cache.move_slots(*moves)
        seq.num_computed += result.num_accepted
        if state.eviction is not None:  # the committed rows only, their keys now at consecutive slots
            self.evictor.observe(state.eviction, chunk.start, entry.slots, queries, kept)
        speculation.add_features(chunk.start, features[kept])
        speculation.record(tree, result, seconds_per_row * chunk.num_tokens + rows.seconds, state.stats)
        depth = None if tree.is_chain() else tree.max_depth
        logprobs = _logprobs(state, rows, result.tokens, kept, speculation.row_masks)
        return self._commit(state, result.tokens, chunk.num_drafts, result.num_accepted, depth, True, logprobs)

    def _commit(
        self,
        state: SequenceState,
        tokens: list[int],
        drafted: int = 0,
        accepted: int = 0,
        depth: int | None = None,
        decoding: bool = True,
        logprobs: list[TokenLogprob] | None = None,
    ) -> SequenceOutput:
        """Add a step's tokens to the sequence (up to a stop condition); `decoding`: the step ran the
        pending token alone (with any drafts), not the end of a prompt chunk."""
        dead_end = False
        if state.matcher is not None:  # every token was drawn under its mask: all are consumed but at a dead end
            consumed = state.matcher.advance(tokens)
            # (a verifier's bonus token after an accepted EOS draft is refused too: not a dead end)
            dead_end, tokens = consumed < len(tokens) and not state.matcher.is_terminated(), tokens[:consumed]
            if state.matcher.is_terminated() and tokens and tokens[-1] in state.matcher.vocab.eos_token_ids:
                tokens = tokens[:-1]  # a complete grammar ends the output without its EOS, as without drafts
        taken = state.tracker.add(tokens)
        if state.matcher is not None and not state.tracker.finished:
            if dead_end:  # no token was allowed and the grammar was not complete
                state.tracker.finish("grammar_dead_end")
            elif state.matcher.is_terminated():  # only EOS may follow: done, without a pass for the EOS
                state.tracker.finish("stop")
        seq, stats = state.seq, state.stats
        seq.output_ids.extend(tokens[:taken])
        if logprobs is not None:
            logprobs = logprobs[:taken]
            state.logprobs.extend(logprobs)
        self.block_manager.mark_computed(seq.seq_id, seq.token_ids, seq.num_computed)
        now = time.perf_counter()
        if len(state.tracker.token_ids) == taken:  # the first token(s) of this sequence
            stats.prefill_seconds = now - state.t_arrival  # time to first token
        if decoding:
            stats.record_step(drafted, accepted, taken, depth)
        out = SequenceOutput(
            state.request.request_id,
            state.index,
            tokens[:taken],
            state.tracker.take_delta(),
            num_drafted=drafted,
            num_accepted=accepted,
            draft_depth=depth,
            logprobs=logprobs,
        )
        if state.tracker.finished:
            stats.completion_tokens = len(state.tracker.token_ids)
            stats.seconds = now - state.t_arrival
            if state.matcher is not None:
                stats.grammar_seconds = state.matcher.seconds
            out.output = RequestOutput(
                state.request.request_id,
                state.prompt,
                state.tracker.text,
                state.tracker.token_ids,
                state.tracker.finish_reason,
                stats,
                state.logprobs if state.request.params.logprobs is not None else None,
            )
            self.table.finish(state)
        return out


def _logprobs(
    state: SequenceState,
    rows: RowLogits,
    tokens: list[int],
    row_ids: list[int] | None = None,
    masks: torch.Tensor | None = None,
) -> list[TokenLogprob] | None:
    """What a request with `logprobs` reports for a step's tokens (token i chosen at row row_ids[i]):
    the target's log-softmax at temperature 1 there, under the grammar's mask at that row (`masks`,
    the verification's; a plain draw's is the matcher's mask now), so the same with and without
    speculation. None when the request did not ask (no work)."""
    top_n = state.request.params.logprobs
    if top_n is None:
        return None
    row_ids = row_ids if row_ids is not None else list(range(len(tokens)))
    logits = torch.stack([rows.row(r) for r in row_ids])  # [tokens, vocab]
    mask = None
    if state.matcher is not None:
        mask = masks[row_ids] if masks is not None else state.matcher.allowed_mask()[None]
        mask = mask.clone()
        mask[~mask.any(-1)] = True  # a dead end's row (its token is dropped)
        mask[torch.arange(len(tokens)), torch.tensor(tokens)] = True  # (a dead end's refused token)
    return [TokenLogprob(t, lp, top) for t, (lp, top) in zip(tokens, token_logprobs(logits, tokens, top_n, mask))]


def _hand_features(state: SequenceState, start: int, features: torch.Tensor) -> None:
    """A speculating sequence's proposer gets the features of rows start.. (if it drafts from them)."""
    if state.speculation is not None:
        state.speculation.add_features(start, features)
