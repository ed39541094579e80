"""The target's proposer in a deployment: asks the draft service for K tokens each step, and decodes the
sequence alone once the draft service fails it (lossless either way: the target verifies every token)."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import torch

from speclm.sampling_params import SamplingParams
from speclm.speculative.proposer import Proposal, Proposer

log = logging.getLogger(__name__)


@dataclass
class DraftReply:
    """What the draft service answers a propose call with: the proposal and the seconds its model took."""

    proposal: Proposal
    model_seconds: float


@dataclass
class DraftCallStats:
    """The draft calls of one target replica: how many, their wall time as the target waited on them, the
    draft model's own time inside them (the difference is the hop: serialization, routing, network), and
    the sequences that fell back to plain decoding."""

    calls: int = 0
    call_seconds: float = 0.0
    model_seconds: float = 0.0
    failures: int = 0

    def to_dict(self) -> dict:
        hop = (self.call_seconds - self.model_seconds) / self.calls if self.calls else 0.0
        return {**self.__dict__, "hop_seconds_per_call": hop}


class RemoteDraftProposer(Proposer):
    """A draft-model proposer whose model runs in the draft service (`handle`: a Ray Serve handle to it).

    Each sequence has a key the draft service multiplexes on, so Ray Serve routes its calls to the replica
    that holds its draft KV cache. A call that fails or takes longer than `timeout` seconds (the replica
    died, or none is up) turns this sequence to plain decoding for good: the tokens stay the target's, only
    slower, and the client sees no error.
    """

    name = "remote-draft"

    def __init__(self, handle, timeout: float, stats: DraftCallStats | None = None) -> None:
        self.handle, self.timeout = handle, timeout
        self.stats = stats or DraftCallStats()  # shared by every sequence's copy
        self.key = ""
        self.capacity = 0
        self.seed: int | None = None
        self.failed = False

    def fresh(self) -> RemoteDraftProposer:
        return RemoteDraftProposer(self.handle, self.timeout, self.stats)

    def start(self, prompt_ids: list[int], capacity: int) -> None:
        self.key, self.capacity, self.failed, self.seed = uuid.uuid4().hex, capacity, False, None

    def propose(
        self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        if self.failed:
            return Proposal()
        if self.seed is None:  # the draft's own random stream, drawn from the sequence's (reproducible with a seed)
            self.seed = int(torch.randint(2**62, (1,), generator=generator))
        t0, response = time.perf_counter(), None
        try:
            response = self.handle.options(multiplexed_model_id=self.key).propose.remote(
                context, k, params, self.seed, self.capacity
            )
            reply: DraftReply = response.result(timeout_s=self.timeout)
        except Exception as e:  # noqa: BLE001 - any draft-side failure costs speed only, never correctness
            if response is not None:
                response.cancel()  # a call that timed out must not run on
            self.failed = True
            self.stats.failures += 1
            log.warning("speclm deploy: the draft service failed a call (%s); this sequence decodes alone", e)
            return Proposal()
        self.stats.calls += 1
        self.stats.call_seconds += time.perf_counter() - t0
        self.stats.model_seconds += reply.model_seconds
        return reply.proposal
