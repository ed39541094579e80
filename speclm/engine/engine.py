"""The engine: many requests at once over a paged KV cache, with speculative decoding inside the batch.
Both the Python API (LLM) and the server drive it; a single request is a batch of one.

A step is: propose (each speculating sequence drafts) -> schedule (which tokens run, how many drafts
are granted) -> run (one batched forward) -> finish (per sequence: verify, commit, hand features on).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import torch

from speclm.config import CacheConfig, SpecConfig
from speclm.engine.eviction import KVEvictor, draft_room
from speclm.engine.model_runner import ModelRunner, RowLogits
from speclm.engine.request import GenerationStats, PromptLimits, Request, RequestOutput, SequenceOutput
from speclm.engine.scheduler import ScheduledChunk, Scheduler
from speclm.engine.sequence import Sequence, SequenceState
from speclm.engine.speculation import Speculation
from speclm.engine.stop import OutputTracker
from speclm.kv.block_manager import BlockManager
from speclm.models.attention import BatchEntry
from speclm.sample.rejection import RejectionSampler
from speclm.sample.sampler import select_tokens
from speclm.speculative.proposer import Proposer
from speclm.tokenizer import Tokenizer

ProposerFactory = Callable[[SpecConfig], Proposer]
ENGINE_DEFAULT = "engine-default"  # add_request(spec=...) sentinel: use the engine's speculative config


class Engine:
    """Continuous batching over a paged KV cache with prefix caching; n > 1 samples share the prompt's
    blocks copy-on-write. Not thread-safe: drive it from one thread (see engine/async_engine.py).

    Speculative decoding runs inside the batch: each sequence has its own proposer and adaptive K
    (`spec` per request, or the engine's), its drafts are verified in the same forward as the other
    sequences' tokens, and a step with more than `spec_max_batch` running sequences skips proposing
    (a big batch already keeps the weights busy; extra verification rows stop paying).

    Every row attends like plain decoding (speclm/models/attention.py), so a request's tokens do not
    depend on what else runs. Feature proposers (Medusa, EAGLE) get the target features of every
    position whose next token is committed, taken from the batched forward. A sequence whose proposer
    needs every feature (EAGLE) computes its whole prompt: prefix-cache blocks hold no features.
    """

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Tokenizer,
        config: CacheConfig | None = None,
        spec: SpecConfig | None = None,
        make_proposer: ProposerFactory | None = None,
        spec_max_batch: int = 8,
    ) -> None:
        if spec is not None and make_proposer is None:
            raise ValueError("a speculative config needs a proposer factory")
        self.spec, self.make_proposer, self.spec_max_batch = spec, make_proposer, spec_max_batch
        self.verifier = RejectionSampler()
        self.runner, self.tokenizer = runner, tokenizer
        self.config = config or CacheConfig()
        quantize = self.config.kv_cache_dtype == "int8"
        num_blocks = self.config.resolve_num_blocks(runner.kv_bytes_per_token(quantize), runner.context_length)
        bs, window, evicting = self.config.block_size, self.config.streaming_window, self.config.token_eviction
        window_blocks = None if window is None else -(-window // bs)
        prefix_caching = self.config.enable_prefix_caching and not evicting  # H2O, SnapKV rewrite blocks in place
        self.block_manager = BlockManager(
            num_blocks, bs, prefix_caching, window_blocks, -(-self.config.attention_sinks // bs)
        )
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens)
        self.cache = runner.new_paged_cache(num_blocks, bs, quantize)
        self.evictor = KVEvictor(self.config, runner.config, self.cache, self.block_manager) if evicting else None
        # Eviction bounds each sequence's entries, not its length (positions keep counting).
        bounded = window or evicting
        self.max_total_tokens = runner.context_length if bounded else min(runner.context_length, num_blocks * bs)
        self._states: dict[str, SequenceState] = {}
        self._by_request: dict[str, list[SequenceState]] = {}
        self.num_steps = 0

    # -- requests ----------------------------------------------------------------------
    @property
    def limits(self) -> PromptLimits:
        return PromptLimits(
            self.runner.config.vocab_size,
            self.max_total_tokens,
            self.config.max_num_seqs,
            self.runner.context_length,
            self.block_manager.num_blocks * self.config.block_size,
        )

    def check_prompt(self, prompt_ids: list[int]) -> None:
        """ValueError when the prompt is empty, has ids outside the vocabulary, or leaves no room for
        one generated token."""
        self.limits.check_prompt(prompt_ids)

    def add_request(
        self, request: Request, n: int = 1, prompt: str | None = None, spec: SpecConfig | None | str = ENGINE_DEFAULT
    ) -> None:
        """Queue a request for n samples; sample i uses seed + i when the request has a seed.
        `spec` overrides the engine's speculative config for this request (None = plain decoding)."""
        spec = self.spec if spec == ENGINE_DEFAULT else spec
        if spec is not None and self.make_proposer is None:
            raise ValueError("this engine has no proposer factory; speculative requests are not supported")
        if request.request_id in self._by_request:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if not 1 <= n <= self.config.max_num_seqs:
            raise ValueError(f"n must be in 1..{self.config.max_num_seqs}, got {n}")
        self.check_prompt(request.prompt_ids)
        params, now = request.params, time.perf_counter()
        total = min(self.max_total_tokens, len(request.prompt_ids) + params.max_tokens)
        states = []
        for i in range(n):
            seed = params.sample_seed(i)
            speculation = (
                Speculation.of(self.make_proposer(spec), spec.num_speculative_tokens, spec.adaptive) if spec else None
            )
            needs_history = speculation is not None and speculation.proposer.feature_history
            seq = Sequence(
                f"{request.request_id}#{i}",
                list(request.prompt_ids),
                total,
                reuse_prefix=not needs_history,
                hold_last=speculation is not None and self.evictor is None,  # evicting: prompts prefill alike
            )
            eviction = self.evictor.new_sequence(seq) if self.evictor is not None else None
            states.append(
                SequenceState(
                    request,
                    i,
                    seq,
                    OutputTracker(self.tokenizer, request.prompt_ids, params, self.max_total_tokens),
                    torch.Generator().manual_seed(seed if seed is not None else random.getrandbits(63)),
                    GenerationStats(prompt_tokens=len(request.prompt_ids)),
                    prompt,
                    now,
                    speculation=speculation,
                    eviction=eviction,
                )
            )
        states[0].forks = states[1:]
        self.scheduler.add(states[0].seq)
        self._by_request[request.request_id] = states
        for s in states:
            self._states[s.seq.seq_id] = s

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks (a client went away, or it failed)."""
        for state in self._by_request.pop(request_id, []):
            self._drop(state)

    def fail_running(self) -> list[str]:
        """After a step raised outside any one sequence's work (the batched forward): drop every
        request with a running sequence (all of them took part) and free their blocks. Waiting
        requests were not touched and go on. Returns the dropped request ids."""
        failed = list(
            dict.fromkeys(
                self._states[s.seq_id].request.request_id for s in self.scheduler.running if s.seq_id in self._states
            )
        )
        for request_id in failed:
            self.abort(request_id)
        return failed

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ----------------------------------------------------------------------
    def step(self) -> list[SequenceOutput]:
        """Propose drafts, schedule, run one batched forward, then verify and commit per sequence."""
        outputs: list[SequenceOutput] = []
        self._evict(outputs)
        wanted = self._propose(outputs)
        plan = self.scheduler.schedule(wanted)
        if not plan.chunks:
            return outputs
        self.num_steps += 1
        self.cache.copy_blocks(plan.copies)
        entries = [self._entry(chunk) for chunk in plan.chunks]
        queries = [] if self.evictor is not None else None  # per layer [heads, num_tokens, head_dim]
        logits, hidden, seconds = self.runner.forward_batch(self.cache, entries, queries)  # [sum of num_logits, vocab]
        # Adaptive K charges a sequence its share (by rows) of the step: charged the whole step, it
        # would pay for the other sequences' drafts too, and none alone would see drafting fail to pay.
        seconds_per_row = seconds / plan.num_tokens
        row, offset = 0, 0
        for chunk, entry in zip(plan.chunks, entries):
            features = hidden[offset : offset + chunk.num_tokens]  # [num_tokens, hidden]
            chunk_queries = [q[:, offset : offset + chunk.num_tokens] for q in queries] if queries else None
            offset += chunk.num_tokens
            rows = logits[row : row + entry.num_logits]
            row += entry.num_logits
            state = self._states.get(chunk.seq.seq_id)
            if state is None:  # its request failed earlier in this step
                continue
            try:
                outputs += self._finish(state, chunk, rows, features, seconds_per_row, entry.slots, chunk_queries)
            except Exception as e:  # this sequence's own work broke: fail its request only
                outputs.append(self._fail(state, e))
        return outputs

    def _evict(self, outputs: list[SequenceOutput]) -> None:
        """H2O / SnapKV: cut each decoding sequence whose committed entries reached its budget."""
        for seq in list(self.scheduler.running) if self.evictor else []:
            state = self._states.get(seq.seq_id)
            if state is None or state.eviction is None or seq.num_uncomputed != 1:
                continue  # (prefilling: a prompt is computed whole, then cut)
            try:
                self.evictor.evict(seq.seq_id, state.eviction, seq.num_computed)
            except Exception as e:
                outputs.append(self._fail(state, e))

    def _propose(self, outputs: list[SequenceOutput]) -> dict[str, int]:
        """Drafts for each speculating sequence whose next step runs its pending token alone (decoding,
        or a new one-token prompt), unless the batch is big: seq_id -> count."""
        running = self.scheduler.running
        if len(running) > self.spec_max_batch:
            return {}
        wanted = {}
        for seq in list(running) + [s for s in self.scheduler.waiting if s.num_uncomputed == 1]:
            state = self._states.get(seq.seq_id)
            if state is None or state.speculation is None or seq.num_uncomputed != 1:
                continue  # (a state is gone when its request failed earlier in this loop)
            try:
                state.speculation.start(seq.prompt_ids, seq.max_total_tokens)
                count = state.speculation.propose(
                    seq.token_ids,
                    state.tracker.remaining - 1,
                    draft_room(seq, self.max_total_tokens, self.block_manager, state.eviction),
                    state.request.params,
                    state.generator,
                )
            except Exception as e:
                outputs.append(self._fail(state, e))
                continue
            if count:
                wanted[seq.seq_id] = count
        return wanted

    def _entry(self, chunk: ScheduledChunk) -> BatchEntry:
        """The runner's input for one scheduled chunk (its tokens, positions and slots)."""
        seq, end, k = chunk.seq, chunk.start + chunk.num_tokens, chunk.num_drafts
        speculation = self._states[seq.seq_id].speculation
        drafts = speculation.proposal.tokens[:k] if k else []
        tokens = (seq.token_ids + drafts)[chunk.start : end]
        row_paths, num_logits = None, 1 + k if chunk.completes else 0
        if k:
            tree = speculation.tree(k)
            row_paths = None if tree.is_chain() else tree.row_paths()
            if speculation.lazy_logits(tree):
                num_logits = 0  # the verifier's walk asks for its path's rows only
        return BatchEntry(tokens, chunk.start, self.block_manager.slot_ids(seq.seq_id, 0, end), num_logits, row_paths)

    def _finish(
        self,
        state: SequenceState,
        chunk: ScheduledChunk,
        rows: torch.Tensor,
        features: torch.Tensor,
        seconds_per_row: float,
        slots: list[int],
        queries: list[torch.Tensor] | None,
    ) -> list[SequenceOutput]:
        """After the forward: commit what the chunk decided for its sequence (and the forks of a prompt).
        `slots` and `queries` (evicting engines) are the chunk's cache slots and its rows' queries."""
        seq, k = chunk.seq, chunk.num_drafts
        state.stats.target_forwards += 1
        seq.num_computed += chunk.num_tokens - k  # accepted drafts are added after verification
        if state.eviction is not None and k == 0:  # every row is committed
            self.evictor.observe(state.eviction, chunk.start, slots, queries, list(range(chunk.num_tokens)))
        if not chunk.completes:  # a prompt chunk: every row's next token is a prompt token
            self.block_manager.mark_computed(seq.seq_id, seq.token_ids, seq.num_computed)
            for s in [state, *state.forks]:
                s.add_features(chunk.start, features)
            return []
        if k and not len(rows):  # a big tree: the walk computes the logits of its path's rows only
            rows = self.runner.row_logits(features)
        outputs = []
        for child in state.forks:  # samples 1..n-1 start from the prompt's blocks, copy-on-write
            self.block_manager.fork(seq.seq_id, child.seq.seq_id)
            child.seq.num_computed = seq.num_computed
            child.eviction = state.eviction.copy() if state.eviction is not None else None
            child.stats.target_forwards += 1  # the prompt's passes are shared
            self.scheduler.add_running(child.seq)
            child.add_features(chunk.start, features[: chunk.num_tokens - k])  # not the parent's drafts
            outputs.append(self._commit(child, [self._sample(child, rows)], decoding=False))
        state.forks = []
        speculation, decoding = state.speculation, chunk.num_tokens - k == 1  # only the pending token (+ drafts)
        if k == 0:
            if speculation is not None and decoding:
                speculation.record_plain_step(seconds_per_row)
            state.add_features(chunk.start, features)
            return outputs + [self._commit(state, [self._sample(state, rows)], decoding=decoding)]
        result, tree = speculation.verify(self.verifier, rows, k, state.request.params, state.generator)
        kept = [0] + [i + 1 for i in result.path]  # rows whose next tokens are now committed
        if not tree.is_chain():  # row r sits at the slot of position start + r: the path moves after the root
            new_slots = self.block_manager.slot_ids(seq.seq_id, chunk.start, chunk.start + chunk.num_tokens)
            self.cache.move_slots([new_slots[r] for r in kept[1:]], new_slots[1 : len(kept)])
        seq.num_computed += result.num_accepted
        if state.eviction is not None:  # the committed rows only, their keys now at consecutive slots
            self.evictor.observe(state.eviction, chunk.start, slots, queries, kept)
        state.add_features(chunk.start, features[kept])
        lazy_seconds = rows.seconds if isinstance(rows, RowLogits) else 0.0
        target_seconds = seconds_per_row * chunk.num_tokens + lazy_seconds
        state.stats.proposer_seconds += speculation.proposer_seconds  # read before record() resets the step
        state.stats.target_seconds += target_seconds
        speculation.record(tree, result, target_seconds)
        depth = None if tree.is_chain() else tree.max_depth
        return outputs + [self._commit(state, result.tokens, k, result.num_accepted, depth, decoding=True)]

    @staticmethod
    def _sample(state: SequenceState, rows: torch.Tensor | RowLogits) -> int:
        """A plain draw from row 0 (the pending token's logits)."""
        first = rows[:1] if isinstance(rows, torch.Tensor) else rows(0)[None]
        return int(select_tokens(first, state.request.params, state.generator)[0])

    def _commit(
        self,
        state: SequenceState,
        tokens: list[int],
        drafted: int = 0,
        accepted: int = 0,
        depth: int | None = None,
        decoding: bool = True,
    ) -> SequenceOutput:
        """Add a step's tokens to the sequence (up to a stop condition); `decoding`: the step ran the
        pending token alone (with any drafts), not the end of a prompt chunk."""
        taken = state.tracker.add(tokens)
        seq, stats = state.seq, state.stats
        seq.output_ids.extend(tokens[:taken])
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
        )
        if state.tracker.finished:
            stats.completion_tokens = len(state.tracker.token_ids)
            stats.seconds = now - state.t_arrival
            out.output = RequestOutput(
                state.request.request_id,
                state.prompt,
                state.tracker.text,
                state.tracker.token_ids,
                state.tracker.finish_reason,
                stats,
            )
            self._drop(state)
            siblings = self._by_request.get(state.request.request_id, [])
            if all(s.seq.finished for s in siblings):
                self._by_request.pop(state.request.request_id, None)
        return out

    def _fail(self, state: SequenceState, error: Exception) -> SequenceOutput:
        """Drop a request whose own work raised; one output carries the error to its caller."""
        self.abort(state.request.request_id)
        return SequenceOutput(state.request.request_id, state.index, [], "", error=error)

    def _drop(self, state: SequenceState) -> None:
        if not state.seq.finished:
            self.scheduler.finish(state.seq)
        self._states.pop(state.seq.seq_id, None)
        for child in state.forks:  # forks that never started
            child.seq.finished = True
            self._states.pop(child.seq.seq_id, None)
        state.forks = []

    # -- offline use -------------------------------------------------------------------
    def generate(
        self, requests: list[Request], n: int = 1, prompts: list[str | None] | None = None
    ) -> list[list[RequestOutput]]:
        """Run requests to completion together; per request its n outputs in sample order. A request
        the engine fails raises its error here."""
        for i, request in enumerate(requests):
            self.add_request(request, n, prompts[i] if prompts else None)
        results: dict[str, list[RequestOutput | None]] = {r.request_id: [None] * n for r in requests}
        while self.has_unfinished():
            for out in self.step():
                if out.error is not None:
                    for request in requests:
                        self.abort(request.request_id)
                    raise out.error
                if out.output is not None:
                    results[out.request_id][out.index] = out.output
        return [results[r.request_id] for r in requests]
