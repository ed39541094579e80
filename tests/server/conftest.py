"""A real uvicorn server on 127.0.0.1 (free port) in a background thread, always shut down."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import pytest


@pytest.fixture(autouse=True)
def _tests_here_use_one_thread(one_thread):
    yield


@contextmanager
def running_server(llm, config=None, api_key=None, model_name="test-model", on_fatal=None, **server):
    """Yield (base_url, app) for a server over `llm` (`server`: ServerConfig fields); stops it (and its
    engine thread) afterwards."""
    import uvicorn

    from speclm.config import CacheConfig
    from speclm.server.app import build_app
    from speclm.server.config import ServerConfig

    app = build_app(
        llm, config or CacheConfig(), ServerConfig(model_name=model_name, api_key=api_key, **server), on_fatal=on_fatal
    )
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}", app
    finally:
        server.should_exit = True
        thread.join(30)
        assert not thread.is_alive(), "server did not stop"


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def default_server(default_llm):
    """A server over the default model (a chat template: chat, tools, structured outputs) with a 64 MB pool;
    yields (base_url, an openai client for it)."""
    import openai

    from speclm.config import CacheConfig

    with running_server(default_llm, CacheConfig(kv_cache_mb=64)) as (url, _):
        yield url, openai.OpenAI(base_url=f"{url}/v1", api_key="x", timeout=120, max_retries=0)
