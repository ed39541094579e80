"""The three Ray Serve deployments: the draft service (K tokens for a sequence), the target service (a
sequence's whole generation: its KV cache, verification and stop checks, in speclm's one engine) and the
coordinator (the OpenAI-compatible HTTP API of `speclm serve`, as the ingress)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

import torch
from ray import serve

from speclm.deploy.config import DeployConfig
from speclm.deploy.coordinator import TargetClient
from speclm.deploy.remote_draft import DraftCallStats, DraftReply, RemoteDraftProposer
from speclm.engine.async_engine import AsyncEngine
from speclm.engine.engine import Engine
from speclm.engine.request import PromptLimits, Request, SequenceOutput
from speclm.llm import LLM
from speclm.sampling_params import SamplingParams
from speclm.server.app import create_app
from speclm.speculative.draft_model import DraftModelProposer
from speclm.speculative.factory import build_draft_proposer
from speclm.threads import default_threads
from speclm.tokenizer import load_tokenizer

# Sequences whose draft KV cache one draft replica keeps (least recently used ones are dropped first; a
# dropped sequence that comes back is re-prefilled by the draft, which costs time, not tokens).
DRAFT_SEQUENCES_PER_REPLICA = 64


class DraftSequence:
    """One sequence's state in the draft service: its proposer (with its draft KV cache) and random stream."""

    def __init__(self, proposer: DraftModelProposer) -> None:
        self.proposer = proposer
        self.generator: torch.Generator | None = None


@serve.deployment(ray_actor_options={"num_cpus": 0})
class DraftService:
    """Proposes K tokens after a sequence's committed tokens. The sequence key is the call's multiplexed
    model id, so Ray Serve sends a sequence's calls to the replica that holds its draft KV cache."""

    def __init__(self, config: DeployConfig) -> None:
        # One thread loads and runs the draft model (a second thread would make torch a second OpenMP
        # team: docs/runtime.md#threads); the replica's event loop only waits for it.
        self.compute = ThreadPoolExecutor(1, "speclm-draft")
        torch.set_num_threads(config.threads or default_threads())
        self.template = self.compute.submit(build_draft_proposer, config.draft_spec(), None).result()

    def vocab_size(self) -> int:
        return self.template.model.config.vocab_size

    @serve.multiplexed(max_num_models_per_replica=DRAFT_SEQUENCES_PER_REPLICA)
    async def sequence(self, key: str) -> DraftSequence:
        return DraftSequence(self.template.fresh())

    async def propose(self, context: list[int], k: int, params: SamplingParams, seed: int, capacity: int) -> DraftReply:
        """Up to k draft tokens after `context` (the sequence's committed tokens); `capacity` bounds its length."""
        t0 = time.perf_counter()
        state = await self.sequence(serve.get_multiplexed_model_id())
        proposal = await asyncio.wrap_future(
            self.compute.submit(self._propose, state, context, k, params, seed, capacity)
        )
        return DraftReply(proposal, time.perf_counter() - t0)

    @staticmethod
    def _propose(state: DraftSequence, context: list[int], k: int, params: SamplingParams, seed: int, capacity: int):
        if state.generator is None:  # a new sequence (or one this replica dropped): start its cache
            state.proposer.start(context, capacity)
            state.generator = torch.Generator().manual_seed(seed)
        return state.proposer.propose(context, k, params, state.generator)


@serve.deployment(ray_actor_options={"num_cpus": 0})
class TargetService:
    """The target model in speclm's engine: each call generates one request to the end (so a sequence, and
    its KV cache, stays on one replica), batched with the replica's other sequences; drafts come from the
    draft service through RemoteDraftProposer."""

    async def __init__(self, config: DeployConfig, draft=None) -> None:
        # The engine loop runs on the thread that loads the model (docs/runtime.md#threads).
        self.compute = ThreadPoolExecutor(1, "speclm-engine")
        llm = await asyncio.wrap_future(
            self.compute.submit(
                LLM,
                config.model,
                tokenizer=config.tokenizer,
                threads=config.threads,
                weights=config.weights,
                device="cpu",  # deploy runs on the CPU (its CLI refuses --device cuda)
            )
        )
        if draft is not None:
            vocab, target_vocab = await draft.vocab_size.remote(), llm.model.config.vocab_size
            if vocab != target_vocab:
                raise ValueError(
                    f"draft model {config.draft} has vocabulary {vocab}, the target {target_vocab}; "
                    "they must share a tokenizer"
                )
        spec = config.draft_spec() if draft is not None else None
        self.draft_stats = DraftCallStats()
        template = RemoteDraftProposer(draft, config.draft_timeout, self.draft_stats)
        engine = Engine(
            llm.runner,
            llm.tokenizer,
            config.cache,
            spec,
            (lambda _spec: template.fresh()) if spec else None,
            config.spec_max_batch,
        )
        self.engine = AsyncEngine(engine)
        running = threading.Event()
        self.compute.submit(self.engine.run_forever, running.set)
        await asyncio.to_thread(running.wait)
        self.finished = {"target_seconds": 0.0, "proposer_seconds": 0.0, "decode_steps": 0}

    def limits(self) -> PromptLimits:
        return self.engine.limits

    def call_stats(self) -> dict:
        """This replica's draft calls (DraftCallStats.to_dict) and, over its finished sequences, the target
        model's seconds, the proposer's seconds (draft calls as the engine timed them) and decoding steps."""
        return {**self.draft_stats.to_dict(), **self.finished}

    async def generate(self, request: Request, n: int = 1, prompt: str | None = None) -> AsyncIterator[SequenceOutput]:
        """The request's outputs as the engine commits them (stream this call)."""
        async for out in self.engine.generate(request, n, prompt):
            if out.output is not None:
                stats = out.output.stats
                self.finished["target_seconds"] += stats.target_seconds
                self.finished["proposer_seconds"] += stats.proposer_seconds
                self.finished["decode_steps"] += stats.decode_steps
            yield out

    def __del__(self) -> None:
        self.engine.stop()


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress()
class Coordinator:
    """The HTTP front: the routes, limits and errors of `speclm serve` (speclm/server/) over the target service."""

    async def __init__(self, config: DeployConfig, target) -> None:
        tokenizer = load_tokenizer(config.model, config.tokenizer)
        limits = await target.limits.remote()
        self.http_app = create_app(TargetClient(target, limits), tokenizer, config.server)

    def __serve_build_asgi_app__(self):
        return self.http_app
