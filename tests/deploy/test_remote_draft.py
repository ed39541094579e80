"""RemoteDraftProposer without Ray: what it sends the draft service, and its fallback to plain decoding."""

from __future__ import annotations

import torch

from speclm.deploy.remote_draft import DraftReply, RemoteDraftProposer
from speclm.sampling_params import SamplingParams
from speclm.speculative.proposer import Proposal


class FakeResponse:
    def __init__(self, reply, error):
        self.reply, self.error, self.cancelled = reply, error, False

    def result(self, timeout_s):
        if self.error is not None:
            raise self.error
        return self.reply

    def cancel(self):
        self.cancelled = True


class FakeHandle:
    """Records calls as a Ray Serve handle would receive them: options(multiplexed_model_id=...).propose.remote(...)."""

    def __init__(self, replies):
        self.replies, self.calls, self.responses = list(replies), [], []
        self.key = None

    def options(self, multiplexed_model_id):
        self.key = multiplexed_model_id
        return self

    @property
    def propose(self):
        return self

    def remote(self, *args):
        self.calls.append((self.key, *args))
        reply = self.replies.pop(0)
        response = FakeResponse(*((None, reply) if isinstance(reply, Exception) else (reply, None)))
        self.responses.append(response)
        return response


def test_calls_carry_the_sequence_key_and_the_stats_add_up():
    handle = FakeHandle([DraftReply(Proposal([5, 6]), 0.001), DraftReply(Proposal([7]), 0.002)])
    template = RemoteDraftProposer(handle, timeout=1.0)
    a, b = template.fresh(), template.fresh()
    a.start([1, 2], 64)
    b.start([3], 64)
    params, generator = SamplingParams(), torch.Generator().manual_seed(0)
    assert a.propose([1, 2], 2, params, generator).tokens == [5, 6]
    assert b.propose([3], 1, params, generator).tokens == [7]
    (key_a, context, k, _, seed_a, capacity), (key_b, *_rest) = handle.calls
    assert key_a != key_b and (context, k, capacity) == ([1, 2], 2, 64)
    assert isinstance(seed_a, int)
    stats = template.stats.to_dict()  # shared by every sequence's copy
    assert stats["calls"] == 2 and stats["failures"] == 0
    assert abs(stats["model_seconds"] - 0.003) < 1e-9 and stats["call_seconds"] >= 0


def test_a_failed_call_turns_the_sequence_to_plain_decoding_for_good():
    handle = FakeHandle([TimeoutError("no draft replica answered"), DraftReply(Proposal([9]), 0.0)])
    proposer = RemoteDraftProposer(handle, timeout=0.1).fresh()
    proposer.start([1], 16)
    params = SamplingParams()
    assert proposer.propose([1], 3, params, None).tokens == []
    assert handle.responses[0].cancelled  # a timed-out call is not left running
    assert proposer.propose([1, 4], 3, params, None).tokens == []  # no second call for this sequence
    assert len(handle.calls) == 1 and proposer.stats.failures == 1
    other = RemoteDraftProposer(handle, timeout=0.1, stats=proposer.stats).fresh()
    other.start([2], 16)
    assert other.propose([2], 1, params, None).tokens == [9]  # a new sequence drafts again
