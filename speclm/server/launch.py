"""Runs an app's engine loop on the calling thread (the one that loaded the model) and its HTTP server
(uvicorn) on a thread of its own: every intra-op parallel region of the engine runs on one thread."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import TypeVar

import uvicorn

T = TypeVar("T")


class _Server(uvicorn.Server):
    """uvicorn's server that reports its URL once its socket accepts connections."""

    def __init__(self, config: uvicorn.Config, on_listening: Callable[[str], None] | None) -> None:
        super().__init__(config)
        self.on_listening = on_listening

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)  # binds and listens; a failure exits the server's thread
        if self.started and self.on_listening is not None and not self.should_exit:
            port = self.servers[0].sockets[0].getsockname()[1]  # the port bound, also for port 0
            host = f"[{self.config.host}]" if ":" in self.config.host else self.config.host
            self.on_listening(f"http://{host}:{port}")


def serve_here(
    app,
    config: uvicorn.Config,
    on_listening: Callable[[str], None] | None = None,
    handle_signals: bool = False,
) -> bool:
    """Serve `app` (create_app's, over an AsyncEngine) until its engine stops or the server ends: the
    engine loop on this thread, uvicorn on another. `on_listening(url)` runs once connections are
    accepted. With `handle_signals` (only on the main thread), SIGTERM and SIGINT shut the server down
    gracefully (in-flight requests get config.timeout_graceful_shutdown to finish); a second SIGINT
    forces it. Returns whether the server started."""
    engine = app.state.engine
    server = _Server(config, on_listening)

    def http() -> None:
        try:
            server.run()
        finally:  # whatever ended the server (a shutdown, a port in use), the engine loop ends with it
            engine.stop()

    def on_signal(sig: int, _frame) -> None:
        if server.should_exit and sig == signal.SIGINT:
            server.force_exit = True
        server.should_exit = True

    thread = threading.Thread(target=http, name="speclm-http", daemon=True)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)} if handle_signals else {}
    try:
        engine.run_forever(ready=thread.start)
    finally:
        server.should_exit = True  # the engine loop died or was stopped: stop serving too
        if thread.ident is not None:
            thread.join()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return server.started


def serve_while(app, work: Callable[[str], T]) -> T:
    """Serve `app` on 127.0.0.1 (a free port) as serve_here does, run `work(url)` on a client thread,
    and stop once it returns; returns its result (or raises its error) on this thread."""
    result: dict = {}

    def client(url: str) -> None:
        try:
            result["value"] = work(url)
        except BaseException as e:  # handed to the calling thread
            result["error"] = e
        finally:
            app.state.engine.stop()

    def on_listening(url: str) -> None:
        threading.Thread(target=client, args=(url,), name="speclm-client", daemon=True).start()

    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning")
    if not serve_here(app, config, on_listening):
        raise RuntimeError("the benchmark server did not start")
    if "error" in result:
        raise result["error"]
    if "value" not in result:
        raise RuntimeError(f"the engine stopped before the client finished ({app.state.engine.fatal!r})")
    return result["value"]
