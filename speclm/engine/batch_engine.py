"""The batched engine: many requests at once over a paged KV cache. A step is schedule -> run -> commit."""
from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from speclm.config import CacheConfig, SpecConfig
from speclm.engine.llm_engine import LAZY_LOGITS_NODES
from speclm.engine.model_runner import ModelRunner, RowLogits
from speclm.engine.request import GenerationStats, Request, RequestOutput
from speclm.engine.scheduler import ScheduledChunk, Scheduler, Sequence
from speclm.engine.stop import OutputTracker
from speclm.kv.block_manager import BlockManager
from speclm.kv.paged_cache import BatchEntry
from speclm.sample.rejection import RejectionSampler, VerificationResult
from speclm.sample.sampler import select_tokens
from speclm.sample.tree_rejection import TreeRejectionSampler
from speclm.spec.adaptive import SpeculationController
from speclm.spec.proposer import Proposal, Proposer, wants_feature_history, wants_features
from speclm.spec.tree import TokenTree, limit_depth
from speclm.tokenizer import Tokenizer

ProposerFactory = Callable[[SpecConfig], Proposer]
ENGINE_DEFAULT = "engine-default"  # add_request(spec=...) sentinel: use the engine's speculative config


@dataclass
class SequenceOutput:
    """What one step committed for one sample (`index` < n) of a request; `output` is set when it finished."""

    request_id: str
    index: int
    token_ids: list[int]
    text: str
    output: RequestOutput | None = None
    num_drafted: int = 0  # speculative tokens verified this step
    num_accepted: int = 0
    draft_depth: int | None = None  # a token tree's depth (None: a chain of num_drafted)

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
    proposer: Proposer | None = None
    controller: SpeculationController | None = None
    proposer_started: bool = False
    proposal: Proposal | None = None
    proposer_seconds: float = 0.0
    num_features: int = 0  # positions whose target features the proposer holds (feature proposers)


class BatchEngine:
    """Continuous batching over a paged KV cache with prefix caching; n > 1 samples share the prompt's
    blocks copy-on-write. Not thread-safe: drive it from one thread (see engine/async_engine.py).

    Speculative decoding runs inside the batch: each sequence has its own proposer and adaptive K
    (`spec` per request, or the engine's), its drafts are verified in the same forward as the
    other sequences' tokens, and a step with more than `spec_max_batch` running sequences skips
    proposing (a big batch already keeps the weights busy; extra verification rows stop paying).

    Medusa / EAGLE proposers (`wants_features`) get the target features of every position whose
    next token is committed, taken from the batched forward (prefill chunks, decode and verification
    rows alike), so they draft as in the single-request engine. EAGLE's sequences compute their whole
    prompt (no prefix-cache reuse: a cached block holds no features; Medusa needs only the last one,
    so it reuses them). Token trees are verified in
    the batch too: each tree row attends to its sequence's prefix and its own path, computed like
    plain decoding, and the accepted path's keys/values are moved into place.
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
        self.verifier, self.tree_verifier = RejectionSampler(), TreeRejectionSampler()
        self.runner = runner
        self.tokenizer = tokenizer
        self.config = config or CacheConfig()
        quantize = self.config.kv_cache_dtype == "int8"
        num_blocks = self.config.resolve_num_blocks(runner.kv_bytes_per_token(quantize), runner.context_length)
        bs, window = self.config.block_size, self.config.streaming_window
        window_blocks = None if window is None else -(-window // bs)
        self.block_manager = BlockManager(num_blocks, bs, self.config.enable_prefix_caching, window_blocks,
                                          -(-self.config.attention_sinks // bs))
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens)
        self.cache = runner.new_paged_cache(num_blocks, self.config.block_size, quantize)
        # A streaming window bounds each sequence's blocks, not its length (positions keep counting).
        self.max_total_tokens = runner.context_length if window else min(runner.context_length, num_blocks * bs)
        self._states: dict[str, _SequenceState] = {}
        self._by_request: dict[str, list[_SequenceState]] = {}
        self.num_steps = 0

    # -- requests ----------------------------------------------------------------------
    def check_prompt(self, prompt_ids: list[int]) -> None:
        """ValueError when the prompt is empty or leaves no room for one generated token."""
        if not prompt_ids:
            raise ValueError("the prompt is empty (no tokens): give at least one token")
        if len(prompt_ids) >= self.max_total_tokens:
            raise ValueError(f"prompt is {len(prompt_ids)} tokens but at most {self.max_total_tokens - 1} fit "
                             f"(context {self.runner.context_length}, KV cache "
                             f"{self.block_manager.num_blocks * self.config.block_size} tokens)")

    def add_request(self, request: Request, n: int = 1, prompt: str | None = None,
                    spec: SpecConfig | None | str = ENGINE_DEFAULT) -> None:
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
        vocab = self.runner.config.vocab_size
        if any(not 0 <= t < vocab for t in request.prompt_ids):
            raise ValueError(f"prompt token ids must be in 0..{vocab - 1}")
        params, now = request.params, time.perf_counter()
        total = min(self.max_total_tokens, len(request.prompt_ids) + params.max_tokens)
        states = []
        for i in range(n):
            seed = params.sample_seed(i)
            seed = seed if seed is not None else random.getrandbits(63)
            proposer = self.make_proposer(spec) if spec else None
            seq = Sequence(f"{request.request_id}#{i}", list(request.prompt_ids), total,
                           reuse_prefix=not wants_feature_history(proposer))
            states.append(_SequenceState(
                request, i, seq, OutputTracker(self.tokenizer, request.prompt_ids, params, self.max_total_tokens),
                torch.Generator().manual_seed(seed), GenerationStats(prompt_tokens=len(request.prompt_ids)),
                prompt, now, proposer=proposer,
                controller=SpeculationController(spec.num_speculative_tokens, spec.adaptive,
                                                 depth_of=getattr(proposer, "tree_depth", None)) if spec else None,
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

    def fail_running(self) -> list[str]:
        """After a step raised: drop every request with a running sequence (all of them took part in
        the batched step, so none can be trusted to continue) and free their blocks. Waiting requests
        were not touched and go on. Returns the dropped request ids."""
        failed = list(dict.fromkeys(self._states[s.seq_id].request.request_id for s in self.scheduler.running
                                    if s.seq_id in self._states))
        for request_id in failed:
            self.abort(request_id)
        return failed

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ----------------------------------------------------------------------
    def step(self) -> list[SequenceOutput]:
        """Propose drafts, run one batched forward over the scheduled chunks, verify and commit."""
        self._propose()
        scheduled = self.scheduler.schedule()
        if not scheduled.chunks:
            return []
        self.num_steps += 1
        self.cache.copy_blocks(scheduled.copies)
        entries = [self._entry(chunk) for chunk in scheduled.chunks]
        logits, hidden, seconds = self.runner.forward_batch(self.cache, entries)  # [sum of num_logits, vocab]
        outputs, row, offset = [], 0, 0
        # Adaptive K charges a sequence its share (by rows) of the step: charged the whole step, it
        # would pay for the other sequences' drafts too, and none alone would see drafting fail to pay.
        seconds_per_row = seconds / scheduled.num_tokens
        for chunk, entry in zip(scheduled.chunks, entries):
            seq, k, state = chunk.seq, chunk.num_drafts, self._states[chunk.seq.seq_id]
            features = hidden[offset : offset + chunk.num_tokens]  # [num_tokens, hidden]
            offset += chunk.num_tokens
            seq.num_computed += chunk.num_tokens - k  # accepted drafts are added after verification
            if not chunk.completes:
                self.block_manager.mark_computed(seq.seq_id, seq.token_ids, seq.num_computed)
                for s in [state, *state.forks]:  # each row's next token is a prompt token
                    self._add_features(s, chunk.start, features)
                continue
            if k and not entry.num_logits:  # a big tree: its walk computes the logits of its path's rows only
                rows: torch.Tensor | RowLogits = self.runner.row_logits(features)
            else:
                rows = logits[row : row + 1 + k]  # [1 + k, vocab]
                row += 1 + k
            for child in state.forks:
                self.block_manager.fork(seq.seq_id, child.seq.seq_id)
                child.seq.num_computed = seq.num_computed
                self.scheduler.add_running(child.seq)
                self._add_features(child, chunk.start, features)
                outputs.append(self._commit(child, [self._sample(child, rows)]))
            state.forks = []
            if k == 0:
                if state.controller is not None and chunk.num_tokens == 1 and seq.output_ids:
                    state.controller.record(0, 0, 0.0, seconds_per_row)  # a plain step's cost, for adaptive K
                self._add_features(state, chunk.start, features)
                outputs.append(self._commit(state, [self._sample(state, rows)]))
                continue
            result, kept, tree = self._verify(state, rows, entry)
            seq.draft_tokens = []
            seq.num_computed += result.num_accepted
            self._add_features(state, chunk.start, features[kept])
            state.proposer.update(result.num_accepted)
            depth = None if tree is None else tree.max_depth
            target_seconds = seconds_per_row * chunk.num_tokens + (rows.seconds if isinstance(rows, RowLogits) else 0.0)
            state.controller.record(k, result.num_accepted, state.proposer_seconds, target_seconds, depth)
            outputs.append(self._commit(state, result.tokens, k, result.num_accepted, depth))
        return outputs

    def _verify(self, state: _SequenceState, rows: torch.Tensor | RowLogits, entry: BatchEntry
                ) -> tuple[VerificationResult, list[int], TokenTree | None]:
        """Verify a sequence's drafts against their rows' logits ([1 + k, vocab], or computed row by
        row for a big tree). Returns the result, the rows whose next tokens are now committed, and
        the token tree (None for a chain)."""
        seq, params, proposal = state.seq, state.request.params, state.proposal
        k = len(entry.tokens) - 1
        drafts, probs = seq.draft_tokens[:k], None if proposal.probs is None else proposal.probs[:k]
        if entry.row_paths is None:
            result = self.verifier.verify(rows, drafts, probs, params, state.generator)
            return result, list(range(result.num_accepted + 1)), None
        tree = TokenTree(tuple(proposal.parents[:k]))
        result = self.tree_verifier.verify(rows, tree, drafts, probs, params, state.generator)
        kept = [0] + [i + 1 for i in result.path]
        # Row r was written at the slot of position start + r; the accepted path moves right after the root.
        new_slots = entry.slots[len(entry.slots) - len(entry.tokens) :]
        self.cache.move_slots([new_slots[r] for r in kept[1:]], new_slots[1 : len(kept)])
        return result, kept, tree

    def _propose(self) -> None:
        """Give each decoding sequence with a proposer its drafts for this step (unless the batch is big)."""
        running = self.scheduler.running
        for seq in running:
            seq.draft_tokens = []
        if len(running) > self.spec_max_batch:
            return
        for seq in running:
            state = self._states[seq.seq_id]
            if state.proposer is None or seq.num_uncomputed != 1 or not seq.output_ids:
                continue
            self._start_proposer(state)
            # K drafts plus the bonus token must fit the budget and the sequence's blocks. A tree's K
            # counts its nodes; only its depth is bounded by the tokens still wanted.
            wanted, room = state.tracker.remaining - 1, seq.max_total_tokens - seq.num_tokens - 1
            window_end = self.block_manager.eviction_free_end(seq.seq_id)
            if window_end is not None:
                # A full StreamingLLM window evicts a block for every new one. Rows of this step stay
                # before that point, or else in the block of its first row (where plain decoding of
                # that row allocates, and so evicts, the same way): a row past it would make the
                # window slide early and change what the earlier rows attend to.
                first, bs = seq.num_tokens - 1, self.config.block_size
                room = min(room, max(window_end, (first // bs + 1) * bs) - 1 - first)
            trees = bool(getattr(state.proposer, "proposes_trees", False))
            k = min(state.controller.next_k(), room if trees else wanted, room)
            if k <= 0 or wanted <= 0:
                continue
            t0 = time.perf_counter()
            proposal = state.proposer.propose(seq.token_ids, k, state.request.params, state.generator)
            if proposal.parents is not None:
                proposal = limit_depth(proposal, wanted)
            state.proposal, state.proposer_seconds = proposal, time.perf_counter() - t0
            seq.draft_tokens = list(proposal.tokens[:k])

    def _start_proposer(self, state: _SequenceState) -> None:
        if not state.proposer_started:
            state.proposer.start(state.seq.prompt_ids, state.seq.max_total_tokens + state.controller.max_k + 1)
            state.proposer_started = True

    def _add_features(self, state: _SequenceState, start: int, features: torch.Tensor) -> None:
        """Hand a feature proposer the target features ([n, hidden]) of positions start..start+n-1,
        whose next tokens are committed, minus those it holds already (a preempted sequence recomputes)."""
        if not wants_features(state.proposer):
            return
        self._start_proposer(state)
        skip = state.num_features - start
        if skip < 0:  # a prefix-cache hit computed no features there
            assert not wants_feature_history(state.proposer), f"{state.seq.seq_id}: features skipped"
            skip = 0
        if skip < features.shape[0]:
            state.proposer.add_features(features[skip:].clone())  # a copy: the step's hidden states are freed
            state.num_features = start + features.shape[0]

    def _entry(self, chunk: ScheduledChunk) -> BatchEntry:
        seq, end = chunk.seq, chunk.start + chunk.num_tokens
        tokens = (seq.token_ids + seq.draft_tokens[: chunk.num_drafts])[chunk.start : end]
        row_paths, num_logits = None, 1 + chunk.num_drafts if chunk.completes else 0
        parents = self._states[seq.seq_id].proposal.parents if chunk.num_drafts else None
        if parents is not None:  # drafts cut short by the scheduler: parents come first, so a prefix is a tree
            tree = TokenTree(tuple(parents[: chunk.num_drafts]))
            row_paths = None if tree.is_chain() else tree.row_paths()
            if row_paths is not None and tree.num_nodes >= LAZY_LOGITS_NODES:
                num_logits = 0  # as in the single-request engine: the walk asks for its path's rows only
        return BatchEntry(tokens, chunk.start, self.block_manager.slot_ids(seq.seq_id, 0, end), num_logits, row_paths)

    @staticmethod
    def _sample(state: _SequenceState, rows: torch.Tensor) -> int:
        return int(select_tokens(rows[:1], state.request.params, state.generator)[0])

    def _commit(self, state: _SequenceState, tokens: list[int], drafted: int = 0, accepted: int = 0,
                depth: int | None = None) -> SequenceOutput:
        taken = state.tracker.add(tokens)
        seq, stats = state.seq, state.stats
        seq.output_ids.extend(tokens[:taken])
        self.block_manager.mark_computed(seq.seq_id, seq.token_ids, seq.num_computed)
        now = time.perf_counter()
        if len(state.tracker.token_ids) == taken:  # the first token(s) of this sequence
            stats.prefill_seconds = now - state.t_arrival  # time to first token
            stats.target_forwards += 1
        else:
            stats.record_step(drafted, accepted, taken, depth)
        out = SequenceOutput(state.request.request_id, state.index, tokens[:taken], state.tracker.take_delta(),
                             num_drafted=drafted, num_accepted=accepted, draft_depth=depth)
        if state.tracker.finished:
            stats.completion_tokens = len(state.tracker.token_ids)
            stats.seconds = now - state.t_arrival
            stats.target_forwards += seq.num_preemptions
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
