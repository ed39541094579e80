"""The OpenAI-compatible FastAPI app: routes (routes.py) behind the gate (gate.py), errors in OpenAI's
envelope (errors.py), and the engine thread started and stopped with the app."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING

from fastapi import FastAPI

from speclm.config import CacheConfig
from speclm.engine.async_engine import AsyncEngine
from speclm.server.config import ServerConfig
from speclm.server.errors import install_error_handlers, openapi_with_error_responses
from speclm.server.gate import Gate
from speclm.server.metrics import ServerMetrics
from speclm.server.routes import router
from speclm.server.service import GenerationBackend, GenerationService
from speclm.tokenizer import Tokenizer

if TYPE_CHECKING:
    from speclm.llm import LLM


def create_app(
    engine: GenerationBackend,
    tokenizer: Tokenizer,
    config: ServerConfig | None = None,
    metrics: ServerMetrics | None = None,
) -> FastAPI:
    """An app serving `engine` (an AsyncEngine, or a deployment's target client), started and stopped with
    the app (`app.state.service` holds engine, tokenizer, limits and metrics)."""
    config = config or ServerConfig()
    metrics = metrics or ServerMetrics()
    engine.observer = metrics
    service = GenerationService(engine, tokenizer, config, metrics)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine.start()
        service.update_metrics()
        if engine.engine is not None:  # the grammar engine's view of the tokenizer, before the socket listens:
            # building it holds the GIL for its whole run (seconds for a 151k vocabulary), so on a thread of its
            # own beside the engine's it stalled the first requests' steps by as long
            _build_grammar_vocab(engine.engine)
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="speclm", description="OpenAI-compatible completions and chat completions", lifespan=lifespan)
    app.state.service = service
    app.state.engine = engine
    install_error_handlers(app)
    app.include_router(router)
    app.add_middleware(
        Gate, config=config, on_status=lambda path, status: metrics.requests.labels(path, str(status)).inc()
    )
    app.openapi = lambda: openapi_with_error_responses(app)
    return app


def _build_grammar_vocab(engine) -> None:
    try:
        engine.grammar_vocab()
    except Exception as e:  # (a tokenizer without EOS): constrained requests will fail with the reason
        logging.getLogger("speclm.server").warning("structured outputs unavailable: %s", e)


def served_model_name(model_path: str) -> str:
    """The id a model is served under by default: its file or directory name."""
    return os.path.splitext(os.path.basename(os.path.normpath(model_path)))[0]


def build_app(
    llm: LLM,
    cache: CacheConfig | None = None,
    server: ServerConfig | None = None,
    spec_max_batch: int | None = None,
    on_fatal: Callable[[BaseException], None] | None = None,
) -> FastAPI:
    """The app serving `llm`'s engine (`speclm serve` loads the LLM with its cache settings). With `cache`
    or `spec_max_batch`, it serves an engine of its own over them instead (one loaded model served several
    ways: benchmarks, tests); `llm`'s own engine is built only where `llm` is also used in-process (an
    LLM builds its engine at first use). `server` defaults to the model's file name as its id."""
    server = server or ServerConfig(model_name=served_model_name(llm.model_path))
    served = llm if cache is None and spec_max_batch is None else llm.with_engine(cache, spec_max_batch)
    return create_app(AsyncEngine(served.engine, on_fatal=on_fatal), llm.tokenizer, server)
