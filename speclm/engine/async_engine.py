"""Drives an Engine from one thread (the caller's, or one of its own) and hands each request's outputs to asyncio
callers."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

from speclm.engine.engine import Engine
from speclm.engine.request import PromptLimits, Request, SequenceOutput


class RequestFailedError(RuntimeError):
    """The engine failed this request (a step raised while it ran); the engine goes on serving."""


class EngineStoppedError(RuntimeError):
    """The engine is not running (shut down, or its loop died): no request can be served."""


class EngineObserver(Protocol):
    """Receives engine events (the server's Prometheus metrics implement it)."""

    def on_step(self, engine: Engine, outputs: list[SequenceOutput], seconds: float) -> None: ...

    def on_token_times(self, ttft: list[float], itl: list[float]) -> None: ...


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    n: int
    arrival: float
    finished: set[int] = field(default_factory=set)
    last_time: dict[int, float] = field(default_factory=dict)

    def put(self, item: SequenceOutput | BaseException | None) -> None:
        """Hand an item to the waiting caller (thread-safe); a closed event loop has no caller left."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:
            pass


class AsyncEngine:
    """Thread-safe front of an Engine: `generate` is an async iterator of SequenceOutputs.

    All engine calls happen on the engine thread; callers only post additions and aborts to an
    inbox, so a step never races with a new request or a disconnect. A step that raises fails the
    requests that took part in it (RequestFailedError) and the loop goes on; if the loop itself
    dies, every caller gets EngineStoppedError, `alive` turns False and `on_fatal` is called (the
    server then exits non-zero so that a supervisor restarts it).

    The engine thread is the caller's with `run_forever()` (what `speclm serve` does: the thread that
    loaded the model drives it, so torch's intra-op pool, an OpenMP team per calling thread, has one
    team, see docs/runtime.md#threads), or a thread of its own with `start()` (tests, in-process apps).
    """

    def __init__(
        self,
        engine: Engine,
        observer: EngineObserver | None = None,
        on_fatal: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.engine = engine
        self.observer = observer
        self.on_fatal = on_fatal
        self._inbox: list[tuple[str, object]] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None  # the loop's own thread (start())
        self._running = False  # the loop runs (or is about to), on its own thread or the caller's
        self._driven_here = False  # run_forever() drives the loop: start() does nothing
        self._stopping = False
        self.fatal: BaseException | None = None  # why the loop died
        self.num_failed_steps = 0

    @property
    def alive(self) -> bool:
        return self.fatal is None and self._running

    @property
    def limits(self) -> PromptLimits:
        return self.engine.limits

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        """Run the loop on a thread of its own; nothing to do if it runs already or run_forever() drives it."""
        if self._thread is None and not self._driven_here:
            self._stopping = False
            self._running = True
            self._thread = threading.Thread(target=self._run, name="speclm-engine", daemon=True)
            self._thread.start()

    def run_forever(self, ready: Callable[[], None] | None = None) -> None:
        """Run the loop on the calling thread until stop() or until the loop dies. `ready` is called
        once the loop is in place (start the HTTP server there: its start() is then a no-op)."""
        if self._thread is not None or self._driven_here:
            raise RuntimeError("the engine loop runs already")
        self._driven_here, self._stopping, self._running = True, False, True
        if ready is not None:
            ready()
        self._run()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still running are aborted and their callers get EngineStoppedError.
        A loop on run_forever()'s thread is not waited for: that thread returns from it."""
        self._stopping = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
            self._thread = None

    # -- caller side (event loop) ------------------------------------------------------
    async def generate(self, request: Request, n: int = 1, prompt: str | None = None) -> AsyncIterator[SequenceOutput]:
        """Yield the request's outputs as steps commit them (the request checked against `limits` by the
        caller); aborts the request if the consumer leaves early."""
        if not self.alive:
            raise EngineStoppedError("the engine is not running")
        if request.params.constraint is not None:
            # The grammar engine's view of the tokenizer takes seconds to build the first time: wait for it
            # here, on a worker thread, so the engine thread never does and other requests go on meanwhile.
            await asyncio.to_thread(self.engine.grammar_vocab)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), n, time.perf_counter())
        self._post("add", (request, n, prompt, stream))
        done = False
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, BaseException):
                    done = True  # the engine side already dropped it
                    raise item
                if item is None:
                    done = True
                    return
                yield item
        finally:
            if not done:
                self._post("abort", request.request_id)

    def _post(self, kind: str, payload: object) -> None:
        with self._lock:
            self._inbox.append((kind, payload))
        self._wake.set()

    # -- engine thread -----------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._drain_inbox()
                if not self.engine.has_unfinished():
                    self._wake.wait(0.5)
                    self._wake.clear()
                    continue
                t0 = time.perf_counter()
                try:
                    outputs = self.engine.step()
                except Exception as e:  # a bug met by some request: fail those requests, keep serving
                    self._fail_step(e)
                    continue
                self._dispatch(outputs, time.perf_counter() - t0)
        except BaseException as e:  # the loop itself broke: nothing can be served any more
            self.fatal = e
            traceback.print_exc(file=sys.stderr)
            if self.on_fatal is not None:
                self.on_fatal(e)
        finally:
            self._running = False
            self._drain_inbox()
            for request_id in list(self._streams):
                self.engine.abort(request_id)
            self._fail_streams(list(self._streams), EngineStoppedError("the engine stopped"))

    def _fail_step(self, error: Exception) -> None:
        self.num_failed_steps += 1
        print(f"speclm: error: an engine step failed; failing the requests in it ({error!r}):", file=sys.stderr)
        traceback.print_exc(file=sys.stderr)
        failed = self.engine.fail_running()
        self._fail_streams(failed, RequestFailedError(f"the engine failed this request: {type(error).__name__}"))
        if self.observer is not None:
            self.observer.on_step(self.engine, [], 0.0)

    def _drain_inbox(self) -> None:
        with self._lock:
            inbox, self._inbox = self._inbox, []
        for kind, payload in inbox:
            if kind == "add":
                request, n, prompt, stream = payload
                if self._stopping:
                    stream.put(EngineStoppedError("the engine is stopping"))
                    continue
                try:
                    self.engine.add_request(request, n, prompt)
                except ValueError as e:
                    stream.put(e)
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
            if out.error is not None:  # the engine dropped this request alone; the others go on
                self._fail_streams(
                    [out.request_id], RequestFailedError(f"the engine failed this request: {type(out.error).__name__}")
                )
                continue
            if out.token_ids:
                last = stream.last_time.get(out.index)
                (itl if last is not None else ttft).append(now - (last if last is not None else stream.arrival))
                stream.last_time[out.index] = now
            stream.put(out)
            if out.finished:
                stream.finished.add(out.index)
                if len(stream.finished) == stream.n:
                    del self._streams[out.request_id]
                    stream.put(None)
        if self.observer is not None:
            self.observer.on_token_times(ttft, itl)
            self.observer.on_step(self.engine, outputs, seconds)

    def _fail_streams(self, request_ids: list[str], error: BaseException) -> None:
        for request_id in request_ids:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                stream.put(error)
