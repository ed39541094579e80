"""The batched engine: many requests at once over a paged KV cache. A step is schedule -> run -> commit."""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch

from speclm.config import CacheConfig
from speclm.engine.model_runner import ModelRunner
from speclm.engine.request import GenerationStats, Request, RequestOutput
from speclm.engine.scheduler import ScheduledChunk, Scheduler, Sequence
from speclm.engine.stop import OutputTracker
from speclm.kv.block_manager import BlockManager
from speclm.kv.paged_cache import BatchEntry
from speclm.sample.sampler import select_tokens
from speclm.tokenizer import Tokenizer


@dataclass
class SequenceOutput:
    """What one step committed for one sample (`index` < n) of a request; `output` is set when it finished."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    output: RequestOutput | None = None

    @property
    def finished(self) -> bool:
        return self.output is not None


@dataclass
class _SequenceState:
    request: Request
    index: int
    seq: Sequence
    tracker: OutputTracker
    generator: torch.Generator
    stats: GenerationStats
    prompt: str | None
    t_arrival: float
    forks: list["_SequenceState"] = field(default_factory=list)  # samples 1..n-1, forked after prefill


class BatchEngine:
    """Continuous batching over a paged KV cache with prefix caching; n > 1 samples share the prompt's
    blocks copy-on-write. Not thread-safe: drive it from one thread (see engine/async_engine.py)."""

    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer, config: CacheConfig | None = None) -> None:
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config or CacheConfig()
        c = runner.config
        bytes_per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * runner.model.embed_tokens.weight.element_size()
        num_blocks = self.config.resolve_num_blocks(bytes_per_token, runner.context_length)
        self.block_manager = BlockManager(num_blocks, self.config.block_size, self.config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens)
        self.cache = runner.new_paged_cache(num_blocks, self.config.block_size)
        self.max_total_tokens = min(runner.context_length, num_blocks * self.config.block_size)
        self._states: dict[str, _SequenceState] = {}
        self._by_request: dict[str, list[_SequenceState]] = {}
        self.num_steps = 0

    # -- requests ----------------------------------------------------------------------
    def check_prompt(self, prompt_ids: list[int]) -> None:
        """ValueError when the prompt leaves no room for one generated token."""
        if len(prompt_ids) >= self.max_total_tokens:
            raise ValueError(f"prompt is {len(prompt_ids)} tokens but at most {self.max_total_tokens - 1} fit "
                             f"(context {self.runner.context_length}, KV cache "
                             f"{self.block_manager.num_blocks * self.config.block_size} tokens)")

    def add_request(self, request: Request, n: int = 1, prompt: str | None = None) -> None:
        """Queue a request for n samples; sample i uses seed + i when the request has a seed."""
        if request.request_id in self._by_request:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if not 1 <= n <= self.config.max_num_seqs:
            raise ValueError(f"n must be in 1..{self.config.max_num_seqs}, got {n}")
        self.check_prompt(request.prompt_ids)
        params, now = request.params, time.perf_counter()
        total = min(self.max_total_tokens, len(request.prompt_ids) + params.max_tokens)
        states = []
        for i in range(n):
            seed = params.seed + i if params.seed is not None else random.getrandbits(63)
            seq = Sequence(f"{request.request_id}#{i}", list(request.prompt_ids), total)
            states.append(_SequenceState(
                request, i, seq, OutputTracker(self.tokenizer, request.prompt_ids, params, self.max_total_tokens),
                torch.Generator().manual_seed(seed), GenerationStats(prompt_tokens=len(request.prompt_ids)),
                prompt, now,
            ))
        states[0].forks = states[1:]
        self.scheduler.add(states[0].seq)
        self._by_request[request.request_id] = states
        for s in states:
            self._states[s.seq.seq_id] = s

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks (a client went away)."""
        for state in self._by_request.pop(request_id, []):
            self._drop(state)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ----------------------------------------------------------------------
    def step(self) -> list[SequenceOutput]:
        """Run one batched forward over the scheduled chunks and commit the sampled tokens."""
        scheduled = self.scheduler.schedule()
        if not scheduled.chunks:
            return []
        self.num_steps += 1
        self.cache.copy_blocks(scheduled.copies)
        entries = [self._entry(chunk) for chunk in scheduled.chunks]
        logits, _ = self.runner.forward_batch(self.cache, entries)  # [completing chunks, vocab]
        outputs, row = [], 0
        for chunk in scheduled.chunks:
            seq = chunk.seq
            seq.num_computed += chunk.num_tokens
            self.block_manager.mark_computed(seq.seq_id, seq.token_ids, seq.num_computed)
            if not chunk.completes:
                continue
            state, row_logits = self._states[seq.seq_id], logits[row : row + 1]  # [1, vocab]
            row += 1
            for child in state.forks:
                self.block_manager.fork(seq.seq_id, child.seq.seq_id)
                child.seq.num_computed = seq.num_computed
                self.scheduler.add_running(child.seq)
                outputs.append(self._commit(child, row_logits))
            state.forks = []
            outputs.append(self._commit(state, row_logits))
        return outputs

    def _entry(self, chunk: ScheduledChunk) -> BatchEntry:
        seq, end = chunk.seq, chunk.start + chunk.num_tokens
        return BatchEntry(seq.token_ids[chunk.start : end], chunk.start,
                          self.block_manager.slot_ids(seq.seq_id, 0, end), 1 if chunk.completes else 0)

    def _commit(self, state: _SequenceState, logits: torch.Tensor) -> SequenceOutput:
        token = int(select_tokens(logits, state.request.params, state.generator)[0])
        taken = state.tracker.add([token])
        state.seq.output_ids.extend([token][:taken])
        now = time.perf_counter()
        if len(state.tracker.token_ids) == 1:
            state.stats.prefill_seconds = now - state.t_arrival  # time to first token
        out = SequenceOutput(state.request.request_id, state.index, [token][:taken], state.tracker.take_delta())
        if state.tracker.finished:
            stats = state.stats
            stats.completion_tokens = len(state.tracker.token_ids)
            stats.seconds = now - state.t_arrival
            stats.decode_steps = stats.decode_tokens = max(0, stats.completion_tokens - 1)
            stats.target_forwards = stats.decode_steps + 1 + state.seq.num_preemptions
            out.output = RequestOutput(state.request.request_id, state.prompt, state.tracker.text,
                                       state.tracker.token_ids, state.tracker.finish_reason, stats)
            self._drop(state)
            siblings = self._by_request.get(state.request.request_id, [])
            if all(s.seq.finished for s in siblings):
                self._by_request.pop(state.request.request_id, None)
        return out

    def _drop(self, state: _SequenceState) -> None:
        if not state.seq.finished:
            self.scheduler.finish(state.seq)
        self._states.pop(state.seq.seq_id, None)
        for child in state.forks:  # forks that never started
            child.seq.finished = True
            self._states.pop(child.seq.seq_id, None)
        state.forks = []

    # -- offline use -------------------------------------------------------------------
    def generate(self, requests: list[Request], n: int = 1) -> list[list[RequestOutput]]:
        """Run requests to completion together; per request its n outputs in sample order."""
        for request in requests:
            self.add_request(request, n)
        results: dict[str, list[RequestOutput | None]] = {r.request_id: [None] * n for r in requests}
        while self.has_unfinished():
            for out in self.step():
                if out.output is not None:
                    results[out.request_id][out.index] = out.output
        return [results[r.request_id] for r in requests]
