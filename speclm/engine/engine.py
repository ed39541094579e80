"""The engine: many requests at once over a paged KV cache, with speculative decoding inside the batch.
Both the Python API (LLM) and the server drive it; a single request is a batch of one.

A step is schedule -> run -> process: evicting sequences are cut and speculating ones draft
(drafter.py), the scheduler picks the tokens to run and grants drafts (scheduler.py), the runner does
one batched forward (model_runner.py), and the output processor samples or verifies, commits and
checks the stop conditions per sequence (output_processor.py).

The engine trusts its requests: the Python API (llm.py) and the server (server/service.py) check
them against `limits` before they get here.
"""

from __future__ import annotations

import random
import time

import torch

from speclm.config import CacheConfig, SpecConfig
from speclm.engine.drafter import Drafter
from speclm.engine.eviction import KVEvictor
from speclm.engine.model_input import batch_entries
from speclm.engine.model_runner import ModelRunner
from speclm.engine.output_processor import OutputProcessor
from speclm.engine.request import GenerationStats, PromptLimits, Request, RequestOutput, SequenceOutput
from speclm.engine.scheduler import Scheduler, SchedulerOutput
from speclm.engine.sequence import Sequence, SequenceState
from speclm.engine.sequence_table import SequenceTable
from speclm.engine.speculation import Speculation
from speclm.engine.stop import OutputTracker
from speclm.kv.block_manager import BlockManager
from speclm.kv.hybrid import HybridBlockManager
from speclm.speculative.controller import PassCosts
from speclm.speculative.factory import ProposerFactory
from speclm.structured.matcher import GrammarMatcher, GrammarVocab
from speclm.tokenizer import Tokenizer


class Engine:
    """Continuous batching over a paged KV cache with prefix caching; n > 1 samples share the prompt's
    blocks copy-on-write. Not thread-safe: drive it from one thread (see engine/async_engine.py).

    Speculative decoding runs inside the batch: with `spec`, each sequence has its own proposer (from
    `make_proposer`) and adaptive K, its drafts are verified in the same forward as the other
    sequences' tokens, and a step with more than `spec_max_batch` sequences (running, or waiting to be
    admitted) skips proposing (a big batch already keeps the weights busy; extra verification rows stop
    paying); None takes the method's default (SpecConfig.default_max_batch: a draft model on a CPU drafts
    for one sequence only).

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
        spec_max_batch: int | None = None,
    ) -> None:
        if spec is not None and make_proposer is None:
            raise ValueError("a speculative config needs a proposer factory")
        self.spec, self.make_proposer = spec, make_proposer
        self.runner, self.tokenizer = runner, tokenizer
        self.config = config or CacheConfig()
        self._new_pools(runner)
        bs, window, evicting = self.config.block_size, self.config.streaming_window, self.config.token_eviction
        num_blocks = self.block_manager.num_blocks
        self.scheduler = Scheduler(self.block_manager, self.config.max_num_seqs, self.config.max_num_batched_tokens)
        self.evictor = KVEvictor(self.config, runner.config, self.cache, self.block_manager) if evicting else None
        # Eviction bounds each sequence's entries, not its length (positions keep counting).
        bounded = window or evicting
        self.max_total_tokens = runner.context_length if bounded else min(runner.context_length, num_blocks * bs)
        self.sequences = SequenceTable(self.scheduler)
        if spec_max_batch is None:
            spec_max_batch = spec.default_max_batch(runner.model.device.type == "cpu") if spec else 0
        self.drafter = Drafter(
            self.scheduler, self.block_manager, self.sequences, self.max_total_tokens, spec_max_batch
        )
        self.processor = OutputProcessor(
            runner, self.cache, self.block_manager, self.scheduler, self.sequences, self.evictor
        )
        self.pass_costs = PassCosts()  # (every sequence's speculation measures and reads it)
        self.num_steps = 0

    def _new_pools(self, runner: ModelRunner) -> None:
        """The block manager and the cache: one pool for every layer, or with sliding-window layers a
        pool of their own that keeps their window only (speclm/kv/hybrid.py; not with H2O / SnapKV,
        which compact every layer's entries alike: their sliding-window layers mask a whole-length pool)."""
        config, quantize, bs = self.config, self.config.kv_cache_dtype == "int8", self.config.block_size
        evicting, window = config.token_eviction, config.streaming_window
        window_blocks = None if window is None else -(-window // bs)
        prefix_caching = config.enable_prefix_caching and not evicting  # H2O, SnapKV rewrite blocks in place
        sinks = -(-config.attention_sinks // bs)
        local_layers, sliding = runner.local_layers, runner.config.sliding_window
        if not any(local_layers) or evicting or not config.sliding_window_pool:
            num_blocks = config.resolve_num_blocks(runner.kv_bytes_per_token(quantize), runner.context_length)
            self.block_manager = BlockManager(num_blocks, bs, prefix_caching, window_blocks, sinks)
            self.cache = runner.new_paged_cache(num_blocks, bs, quantize)
            return
        num_local = sum(local_layers)
        full_blocks, local_blocks = config.resolve_hybrid_blocks(
            runner.kv_bytes_per_token(quantize, len(local_layers) - num_local),
            runner.kv_bytes_per_token(quantize, num_local),
            runner.context_length,
            sliding,
        )
        self.block_manager = HybridBlockManager(
            BlockManager(full_blocks, bs, prefix_caching, window_blocks, sinks),
            BlockManager(local_blocks, bs, prefix_caching, sliding_window=sliding),
        )
        self.cache = runner.new_hybrid_cache(full_blocks, local_blocks, bs, quantize)

    # -- requests ----------------------------------------------------------------------
    @property
    def limits(self) -> PromptLimits:
        """What this engine accepts; the callers check requests against it (the engine does not)."""
        return PromptLimits(
            self.runner.config.vocab_size,
            self.max_total_tokens,
            self.config.max_num_seqs,
            self.runner.context_length,
            self.block_manager.num_blocks * self.config.block_size,
        )

    @property
    def num_kv_blocks(self) -> int:
        """Blocks in the paged KV pool."""
        return self.block_manager.num_blocks

    def add_request(self, request: Request, n: int = 1, prompt: str | None = None) -> None:
        """Queue a request (checked against `limits` by the caller) for n samples; sample i uses
        seed + i when the request has a seed."""
        assert 1 <= n <= self.config.max_num_seqs, n
        params, now = request.params, time.perf_counter()
        total = min(self.max_total_tokens, len(request.prompt_ids) + params.max_tokens)
        states = []
        for i in range(n):
            seed = params.sample_seed(i)
            prompt_ids = list(request.prompt_ids)
            speculation = self._speculation(prompt_ids, total)
            needs_history = speculation is not None and speculation.proposer.feature_history
            seq = Sequence(
                f"{request.request_id}#{i}",
                prompt_ids,
                total,
                reuse_prefix=not needs_history,
            )
            eviction = self.evictor.new_sequence(seq) if self.evictor is not None else None
            matcher = None if params.constraint is None else GrammarMatcher(self.grammar_vocab(), params.constraint)
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
                    matcher=matcher,
                )
            )
        self.sequences.add(states)

    def grammar_vocab(self) -> GrammarVocab:
        """The tokenizer as the grammar engine sees it, built on the first constrained request (about 2 s
        for a 49k vocabulary, 5-20 s for 151k; the server builds it at start) and kept."""
        return GrammarVocab.of(self.tokenizer, self.runner.config.vocab_size)

    def _speculation(self, prompt_ids: list[int], max_total_tokens: int) -> Speculation | None:
        spec = self.spec
        if spec is None:
            return None
        return Speculation.of(
            self.make_proposer(spec),
            spec.max_k,
            spec.adaptive,
            prompt_ids,
            max_total_tokens,
            self.pass_costs,
        )

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks (a client went away, or it failed)."""
        self.sequences.abort(request_id)

    def fail_running(self) -> list[str]:
        """After a step raised outside any one sequence's work (the batched forward): drop every
        request with a running sequence (all of them took part) and free their blocks. Waiting
        requests were not touched and go on. Returns the dropped request ids."""
        failed = self.sequences.running_requests()
        for request_id in failed:
            self.abort(request_id)
        return failed

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # -- the step ----------------------------------------------------------------------
    def step(self) -> list[SequenceOutput]:
        """Schedule (after evictions and drafts), run one batched forward, process its rows per sequence."""
        failed = self.evictor.evict_due(self.scheduler.running, self.sequences) if self.evictor else []
        drafts = self.drafter.propose(failed)
        plan = self.scheduler.schedule(drafts)
        if not plan.chunks:
            return failed
        self.num_steps += 1
        entries = batch_entries(plan, self.block_manager, self.sequences)
        output = self.runner.execute(self.cache, plan.copies, entries, self.evictor is not None, self._ahead(plan))
        return failed + self.processor.process(plan, entries, output)

    def _ahead(self, plan: SchedulerOutput) -> bool:
        """Whether the runner may start the step after this one before this one's tokens are read: every
        chunk is one token of a sequence that decodes greedily (its token will be the row's argmax)."""
        if self.runner.graph_mode is None:
            return False
        states = [self.sequences.get(chunk.seq.seq_id) for chunk in plan.chunks]
        return all(
            chunk.num_tokens == 1 and chunk.completes and state is not None and state.decodes_greedily()
            for chunk, state in zip(plan.chunks, states)
        )

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
