"""The decode loop: prefill, then propose -> verify -> commit until a stop condition.

Plain autoregressive decoding is the same loop with no proposer (K = 0), so both paths share the
target forward, the verifier and the stop handling, and cannot drift apart.
"""
from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from speclm.engine.model_runner import ModelRunner
from speclm.engine.request import GenerationStats, Request, RequestOutput
from speclm.engine.stop import OutputTracker
from speclm.sample.rejection import RejectionSampler
from speclm.sample.tree_rejection import TreeRejectionSampler
from speclm.spec.adaptive import SpeculationController
from speclm.spec.proposer import Proposal, Proposer, wants_features
from speclm.spec.tree import TokenTree, limit_depth
from speclm.tokenizer import Tokenizer


LAZY_LOGITS_NODES = 4  # trees of this many nodes or more compute logits row by row along the walk


@dataclass
class StreamChunk:
    """Text and tokens committed by one engine step; `output` is set on the last chunk."""

    text: str
    token_ids: list[int]
    output: RequestOutput | None = None


class LLMEngine:
    """Generates for one request at a time with an optional speculative proposer."""

    def __init__(
        self,
        runner: ModelRunner,
        tokenizer: Tokenizer,
        proposer: Proposer | None = None,
        num_speculative_tokens: int = 4,
        adaptive: bool = True,
    ) -> None:
        if proposer is not None and not 1 <= num_speculative_tokens <= 32:
            raise ValueError(f"num_speculative_tokens (K) must be in 1..32, got {num_speculative_tokens}")
        self.runner = runner
        self.tokenizer = tokenizer
        self.proposer = proposer
        self.max_k = num_speculative_tokens if proposer is not None else 0
        self.adaptive = adaptive
        self.verifier = RejectionSampler()
        self.tree_verifier = TreeRejectionSampler()

    def check_prompt(self, prompt_ids: list[int]) -> None:
        limit = self.runner.context_length
        if not prompt_ids:
            raise ValueError("the prompt is empty (no tokens): give at least one token")
        if len(prompt_ids) >= limit:
            raise ValueError(
                f"prompt is {len(prompt_ids)} tokens but the model's context is {limit} tokens "
                "(it needs room for at least one generated token)"
            )

    def generate(self, request: Request, prompt: str | None = None) -> RequestOutput:
        for chunk in self.stream(request, prompt):
            if chunk.output is not None:
                return chunk.output
        raise AssertionError("stream ended without an output")

    def stream(self, request: Request, prompt: str | None = None) -> Iterator[StreamChunk]:
        """Yield text as it is generated; the final chunk carries the RequestOutput."""
        params, prompt_ids = request.params, request.prompt_ids
        self.check_prompt(prompt_ids)
        t_start = time.perf_counter()
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        max_total = self.runner.context_length
        capacity = min(max_total, len(prompt_ids) + params.max_tokens + self.max_k + 1)
        cache = self.runner.new_cache(capacity)
        seed = params.sample_seed(0)
        seed = seed if seed is not None else random.getrandbits(63)
        generator = torch.Generator().manual_seed(seed)
        tracker = OutputTracker(self.tokenizer, prompt_ids, params, max_total)
        controller = SpeculationController(self.max_k, adaptive=self.adaptive,
                                           depth_of=getattr(self.proposer, "tree_depth", None))
        if self.proposer is not None:
            self.proposer.start(prompt_ids, capacity)
        features = wants_features(self.proposer)
        trees = bool(getattr(self.proposer, "proposes_trees", False))  # only Medusa/EAGLE-style proposers keep hidden states

        # Prefill all but the last prompt token; the last one is "pending" like every later token, so
        # even the first generated token comes from a propose -> verify step.
        if len(prompt_ids) > 1:
            hidden, seconds = self.runner.prefill_features(cache, prompt_ids[:-1])
            if features:
                self.proposer.add_features(hidden)
            stats.target_forwards, stats.target_seconds = 1, seconds
        stats.prefill_seconds = time.perf_counter() - t_start

        while not tracker.finished:
            context = prompt_ids + tracker.token_ids
            # K drafts plus the bonus token must fit the budget, the cache and the context. A tree's
            # K counts its nodes; only its depth is bounded by the tokens still wanted.
            room = capacity - len(context) - 1
            k = min(controller.next_k(), room if trees else tracker.remaining - 1, room)
            proposal, proposer_seconds = Proposal(), 0.0
            if k > 0 and tracker.remaining > 1:
                t0 = time.perf_counter()
                proposal = self.proposer.propose(context, k, params, generator)
                if proposal.parents is not None:
                    proposal = limit_depth(proposal, tracker.remaining - 1)
                proposer_seconds = time.perf_counter() - t0
            drafts = proposal.tokens
            tree = TokenTree(tuple(proposal.parents)) if proposal.parents is not None and drafts else None
            # A big tree's walk needs the logits of its path's rows only: one-row head calls then cost
            # less than the head over every row (SmolLM2 int4: 3.3 ms for 1 row, 10 ms for 5, 36 ms for 17).
            lazy = tree is not None and tree.num_nodes >= LAZY_LOGITS_NODES
            logits, hidden, target_seconds = self.runner.verify(cache, [context[-1]] + drafts, len(context) - 1, tree,
                                                                logits=not lazy)
            if lazy:
                logits = self.runner.row_logits(hidden)
            if tree is None:
                result = self.verifier.verify(logits, drafts, proposal.probs, params, generator)
                cache.truncate(len(context) + result.num_accepted)
                rows, depth = list(range(result.num_accepted + 1)), len(drafts)
            else:  # move the accepted path's KV entries right after the pending token
                result = self.tree_verifier.verify(logits, tree, drafts, proposal.probs, params, generator)
                cache.keep_slots(len(context), [len(context) + i for i in result.path])
                rows, depth = [0] + [i + 1 for i in result.path], tree.max_depth
                target_seconds += logits.seconds if lazy else 0.0
            if self.proposer is not None:
                if features:  # the rows whose next tokens are now committed
                    self.proposer.add_features(hidden[rows])
                self.proposer.update(result.num_accepted)
            controller.record(len(drafts), result.num_accepted, proposer_seconds, target_seconds,
                              depth if tree is not None else None)
            committed = tracker.add(result.tokens)
            stats.record_step(len(drafts), result.num_accepted, committed, depth)
            stats.proposer_seconds += proposer_seconds
            stats.target_seconds += target_seconds
            yield StreamChunk(tracker.take_delta(), result.tokens[:committed])

        stats.completion_tokens = len(tracker.token_ids)
        stats.seconds = time.perf_counter() - t_start
        output = RequestOutput(request.request_id, prompt, tracker.text, tracker.token_ids, tracker.finish_reason, stats)
        yield StreamChunk(tracker.take_delta(), [], output)
