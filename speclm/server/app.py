"""The OpenAI-compatible FastAPI app: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics."""
from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from speclm.engine.async_engine import AsyncEngine
from speclm.engine.batch_engine import SequenceOutput
from speclm.engine.request import Request as EngineRequest
from speclm.server.metrics import ServerMetrics
from speclm.server.protocol import ChatCompletionRequest, CompletionRequest, error_body
from speclm.tokenizer import Tokenizer


class APIError(Exception):
    """An error answered with the OpenAI envelope and a 4xx status."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code


def create_app(engine: AsyncEngine, tokenizer: Tokenizer, model_name: str, api_key: str | None = None,
               metrics: ServerMetrics | None = None) -> FastAPI:
    """An app serving `engine` under `model_name`; starts the engine thread with the app and stops it after."""
    metrics = metrics or ServerMetrics()
    engine.observer = metrics
    ids = itertools.count()
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        engine.start()
        metrics.update_engine(engine.engine)
        try:
            yield
        finally:
            engine.stop()

    app = FastAPI(title="speclm", lifespan=lifespan)
    app.state.engine, app.state.metrics = engine, metrics

    # -- errors: always the OpenAI envelope, 4xx for the client's mistakes ---------------------
    @app.exception_handler(APIError)
    async def api_error(_request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(error_body(e.message, e.kind, e.param, e.code), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        if first.get("type") == "json_invalid":
            return JSONResponse(error_body(f"malformed JSON body: {first.get('ctx', {}).get('error', 'decode error')}"),
                                status_code=400)
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = f"{'.'.join(loc) + ': ' if loc else ''}{first.get('msg', 'invalid request')}"
        return JSONResponse(error_body(message, param=".".join(loc) or None), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(e.detail)), status_code=e.status_code)

    @app.middleware("http")
    async def auth_and_count(request: Request, call_next):
        path = request.url.path
        if api_key and path.startswith("/v1/") and request.headers.get("authorization") != f"Bearer {api_key}":
            response = JSONResponse(error_body("invalid API key", "authentication_error", code="invalid_api_key"),
                                    status_code=401)
        else:
            response = await call_next(request)
        if path in ("/v1/completions", "/v1/chat/completions"):
            metrics.requests.labels(path, str(response.status_code)).inc()
        return response

    # -- helpers ---------------------------------------------------------------------------------
    def check_model(name: str | None) -> None:
        if name is not None and name != model_name:
            raise APIError(404, f"model {name!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")

    def start(body, prompt_ids: list[int], prompt: str | None, default_max_tokens: int | None):
        """Validate and submit; returns (request id, output iterator)."""
        check_model(body.model)
        if body.n > engine.engine.config.max_num_seqs:
            raise APIError(400, f"n must be at most {engine.engine.config.max_num_seqs}, got {body.n}", param="n")
        vocab = engine.engine.runner.config.vocab_size
        if any(not 0 <= t < vocab for t in prompt_ids):
            raise APIError(400, f"prompt token ids must be in 0..{vocab - 1}", param="prompt")
        try:
            engine.engine.check_prompt(prompt_ids)
        except ValueError as e:
            raise APIError(400, str(e), param="prompt", code="context_length_exceeded") from e
        limit = engine.engine.max_total_tokens - len(prompt_ids)
        try:
            params = body.sampling_params(default_max_tokens or limit)
        except ValueError as e:
            raise APIError(400, str(e)) from e
        metrics.prompt_tokens.inc(len(prompt_ids))
        request_id = f"{next(ids)}-{uuid.uuid4().hex[:8]}"
        return request_id, engine.generate(EngineRequest(request_id, prompt_ids, params), body.n, prompt)

    async def collect(outputs: AsyncIterator[SequenceOutput], raw: Request) -> dict[int, SequenceOutput]:
        """Run to the end, but abort as soon as the client is gone."""
        finals: dict[int, SequenceOutput] = {}

        async def consume() -> None:
            async for out in outputs:
                if out.finished:
                    finals[out.index] = out

        task = asyncio.ensure_future(consume())
        while not task.done():
            await asyncio.wait({task}, timeout=0.5)
            if not task.done() and await raw.is_disconnected():
                task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise APIError(499, "client disconnected")
        if task.exception() is not None:
            raise task.exception()
        return finals

    def usage(prompt_ids: list[int], finals: dict[int, SequenceOutput]) -> dict:
        completion = sum(len(f.output.token_ids) for f in finals.values())
        return {"prompt_tokens": len(prompt_ids), "completion_tokens": completion,
                "total_tokens": len(prompt_ids) + completion}

    def sse(payload: dict | str) -> str:
        return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"

    # -- routes ----------------------------------------------------------------------------------
    @app.get("/health")
    async def health() -> Response:
        if engine.error is not None:
            return JSONResponse({"status": "error", "error": repr(engine.error)}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        metrics.update_engine(engine.engine)
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": created,
                                            "owned_by": "speclm"}]}

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, raw: Request):
        if body.logprobs or body.echo:
            raise APIError(400, "logprobs and echo are not supported", param="logprobs" if body.logprobs else "echo")
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            if len(prompt) != 1:
                raise APIError(400, "only one prompt per request is supported", param="prompt")
            prompt = prompt[0]
        prompt_ids = tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        request_id, outputs = start(body, prompt_ids, prompt if isinstance(prompt, str) else None, 16)
        base = {"id": f"cmpl-{request_id}", "object": "text_completion", "created": int(time.time()),
                "model": model_name}

        def choice(out: SequenceOutput) -> dict:
            return {"index": out.index, "text": out.text, "logprobs": None,
                    "finish_reason": out.output.finish_reason if out.finished else None}

        if body.stream:
            async def events() -> AsyncIterator[str]:
                async for out in outputs:
                    if out.text or out.finished:
                        yield sse({**base, "choices": [choice(out)]})
                yield sse("[DONE]")
            return StreamingResponse(events(), media_type="text/event-stream")
        finals = await collect(outputs, raw)
        choices = [{**choice(finals[i]), "text": finals[i].output.text} for i in sorted(finals)]
        return {**base, "choices": choices, "usage": usage(prompt_ids, finals)}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, raw: Request):
        if body.logprobs:
            raise APIError(400, "logprobs is not supported", param="logprobs")
        try:
            prompt_ids = tokenizer.encode_chat([m.model_dump() for m in body.messages])
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from e
        body.max_tokens = body.max_tokens or body.max_completion_tokens
        request_id, outputs = start(body, prompt_ids, None, None)
        base = {"id": f"chatcmpl-{request_id}", "created": int(time.time()), "model": model_name}

        if body.stream:
            async def events() -> AsyncIterator[str]:
                chunk = {**base, "object": "chat.completion.chunk"}
                for i in range(body.n):
                    delta = {"role": "assistant", "content": ""}
                    yield sse({**chunk, "choices": [{"index": i, "delta": delta, "finish_reason": None}]})
                async for out in outputs:
                    if out.text:
                        yield sse({**chunk, "choices": [{"index": out.index, "delta": {"content": out.text},
                                                         "finish_reason": None}]})
                    if out.finished:
                        yield sse({**chunk, "choices": [{"index": out.index, "delta": {},
                                                         "finish_reason": out.output.finish_reason}]})
                yield sse("[DONE]")
            return StreamingResponse(events(), media_type="text/event-stream")
        finals = await collect(outputs, raw)
        choices = [{"index": i, "message": {"role": "assistant", "content": finals[i].output.text},
                    "logprobs": None, "finish_reason": finals[i].output.finish_reason} for i in sorted(finals)]
        return {**base, "object": "chat.completion", "choices": choices, "usage": usage(prompt_ids, finals)}

    return app
