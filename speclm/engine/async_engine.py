"""Drives a BatchEngine from one background thread and hands each request's outputs to asyncio callers."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol

from speclm.engine.batch_engine import BatchEngine, SequenceOutput
from speclm.engine.request import Request


class EngineObserver(Protocol):
    """Receives engine events (the server's Prometheus metrics implement it)."""

    def on_step(self, engine: BatchEngine, outputs: list[SequenceOutput], seconds: float) -> None: ...

    def on_token_times(self, ttft: list[float], itl: list[float]) -> None: ...


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    n: int
    arrival: float
    finished: set[int] = field(default_factory=set)
    last_time: dict[int, float] = field(default_factory=dict)


class AsyncEngine:
    """Thread-safe front of a BatchEngine: `generate` is an async iterator of SequenceOutputs.

    All engine calls happen on the engine thread; callers only post additions and aborts to an
    inbox, so a step never races with a new request or a disconnect.
    """

    def __init__(self, engine: BatchEngine, observer: EngineObserver | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self._inbox: list[tuple[str, object]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.error: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="speclm-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    # -- caller side (event loop) ------------------------------------------------------
    async def generate(self, request: Request, n: int = 1, prompt: str | None = None) -> AsyncIterator[SequenceOutput]:
        """Yield the request's outputs as steps commit them; aborts the request if the consumer leaves early."""
        self.engine.check_prompt(request.prompt_ids)  # ValueError here, before anything is queued
        if not 1 <= n <= self.engine.config.max_num_seqs:
            raise ValueError(f"n must be in 1..{self.engine.config.max_num_seqs}, got {n}")
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), n, time.perf_counter())
        self._post("add", (request, n, prompt, stream))
        done = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    raise item
                if item is None:
                    done = True
                    return
                yield item
        finally:
            if not done:
                self._post("abort", request.request_id)

    def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def _post(self, kind: str, payload: object) -> None:
        with self._lock:
            self._inbox.append((kind, payload))
        self._wake.set()

    # -- engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping:
            self._drain_inbox()
            if not self.engine.has_unfinished():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            t0 = time.perf_counter()
            try:
                outputs = self.engine.step()
            except Exception as e:  # a bug, not a user error: fail every waiting caller instead of hanging
                self.error = e
                self._fail_all(e)
                return
            self._dispatch(outputs, time.perf_counter() - t0)

    def _drain_inbox(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        for kind, payload in inbox:
            if kind == "add":
                request, n, prompt, stream = payload
                try:
                    self.engine.add_request(request, n, prompt)
                except ValueError as e:
                    stream.loop.call_soon_threadsafe(stream.queue.put_nowait, e)
                    continue
                self._streams[request.request_id] = stream
            elif self._streams.pop(payload, None) is not None:
                self.engine.abort(payload)

    def _dispatch(self, outputs: list[SequenceOutput], seconds: float) -> None:
        now = time.perf_counter()
        ttft, itl = [], []
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue
            if out.token_ids:
                last = stream.last_time.get(out.index)
                (itl if last is not None else ttft).append(now - (last if last is not None else stream.arrival))
                stream.last_time[out.index] = now
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, out)
            if out.finished:
                stream.finished.add(out.index)
                if len(stream.finished) == stream.n:
                    del self._streams[out.request_id]
                    stream.loop.call_soon_threadsafe(stream.queue.put_nowait, None)
        if self.observer is not None:
            self.observer.on_token_times(ttft, itl)
            self.observer.on_step(self.engine, outputs, seconds)

    def _fail_all(self, error: BaseException) -> None:
        for stream in self._streams.values():
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, RuntimeError(f"engine failed: {error!r}"))
        self._streams.clear()
