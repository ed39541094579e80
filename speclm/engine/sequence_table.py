"""The engine's sequences, by sequence id and by request: adding, finishing, aborting and failing them."""

from __future__ import annotations

from speclm.engine.request import SequenceOutput
from speclm.engine.scheduler import Scheduler
from speclm.engine.sequence import SequenceState


class SequenceTable:
    """Every live sequence's state. Dropping a sequence takes it out of the scheduler (freeing its blocks)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._states: dict[str, SequenceState] = {}
        self._by_request: dict[str, list[SequenceState]] = {}

    def add(self, states: list[SequenceState]) -> None:
        """A request's samples; the first is queued now, the others fork off it after its prompt."""
        request_id = states[0].request.request_id
        assert request_id not in self._by_request, f"duplicate request id {request_id!r}"
        states[0].forks = states[1:]
        self.scheduler.add(states[0].seq)
        self._by_request[request_id] = states
        for s in states:
            self._states[s.seq.seq_id] = s

    def get(self, seq_id: str) -> SequenceState | None:
        """The state of a live sequence (None once its request finished, failed or was aborted)."""
        return self._states.get(seq_id)

    def finish(self, state: SequenceState) -> None:
        """A sample reached a stop condition: drop it, and its request once every sample is done."""
        self._drop(state)
        siblings = self._by_request.get(state.request.request_id, [])
        if all(s.seq.finished for s in siblings):
            self._by_request.pop(state.request.request_id, None)

    def abort(self, request_id: str) -> None:
        """Stop a request now and free its blocks (a client went away, or it failed)."""
        for state in self._by_request.pop(request_id, []):
            self._drop(state)

    def fail(self, state: SequenceState, error: Exception) -> SequenceOutput:
        """Drop a request whose own work raised; one output carries the error to its caller."""
        self.abort(state.request.request_id)
        return SequenceOutput(state.request.request_id, state.index, [], "", error=error)

    def running_requests(self) -> list[str]:
        """The ids of the requests with a running sequence, in running order."""
        ids = (self._states[s.seq_id].request.request_id for s in self.scheduler.running if s.seq_id in self._states)
        return list(dict.fromkeys(ids))

    def _drop(self, state: SequenceState) -> None:
        if not state.seq.finished:
            self.scheduler.finish(state.seq)
        self._states.pop(state.seq.seq_id, None)
        for child in state.forks:  # forks that never started
            child.seq.finished = True
            self._states.pop(child.seq.seq_id, None)
        state.forks = []
