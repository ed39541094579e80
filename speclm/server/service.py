"""Between the routes and the engine: check a request against the limits, submit it, and turn the
engine's outputs into OpenAI bodies (whole, or as server-sent events)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from speclm.engine.async_engine import EngineObserver, EngineStoppedError, RequestFailedError
from speclm.engine.engine import Engine
from speclm.engine.request import PromptError, PromptLimits, SequenceOutput
from speclm.engine.request import Request as EngineRequest
from speclm.server.config import ServerConfig
from speclm.server.errors import APIError
from speclm.server.metrics import ServerMetrics
from speclm.server.protocol import ChatCompletionRequest, GenerationRequest
from speclm.server.tool_protocol import ToolRequestError, check_tool_request
from speclm.structured.grammar import Constraint, ConstraintError
from speclm.structured.tools import render_tool_prompt, tool_constraint, tool_format
from speclm.tokenizer import Tokenizer

DISCONNECT_POLL_SECONDS = 0.25  # how often a non-streaming request checks that its client is still there


class GenerationBackend(Protocol):
    """What the server drives: the in-process AsyncEngine (`speclm serve`), or a client of the target
    service of a deployment (`speclm deploy`, speclm/deploy/coordinator.py)."""

    observer: EngineObserver | None
    engine: Engine | None  # the in-process engine (its gauges go to /metrics); None when it runs elsewhere

    @property
    def alive(self) -> bool: ...

    @property
    def limits(self) -> PromptLimits: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def generate(self, request: EngineRequest, n: int = 1, prompt: str | None = None) -> AsyncIterator[SequenceOutput]:
        """The request's outputs as they are committed; RequestFailedError when it fails."""
        ...


@dataclass
class Submission:
    """A request handed to the engine: its id, prompt ids and the engine's outputs for it."""

    request_id: str
    prompt_ids: list[int]
    outputs: AsyncIterator[SequenceOutput]


class GenerationService:
    """One per app: holds the engine, tokenizer, limits and metrics that the routes share."""

    def __init__(
        self, engine: GenerationBackend, tokenizer: Tokenizer, config: ServerConfig, metrics: ServerMetrics
    ) -> None:
        self.engine, self.tokenizer, self.config, self.metrics = engine, tokenizer, config, metrics
        self.created = int(time.time())
        self.in_flight = 0
        self._ids = itertools.count()

    # -- prompts (tokenized in a worker thread: a long prompt must not stall the event loop) -------
    async def encode_text(self, text: str, param: str = "prompt") -> list[int]:
        _check_unicode(text, param)
        return await run_in_threadpool(self.tokenizer.encode, text)

    async def encode_chat(self, body: ChatCompletionRequest) -> list[int]:
        """The chat prompt's ids; with tools (or calls and results in the conversation) rendered by
        render_tool_prompt: the model's own template when it takes tools, else the generic tool prompt."""
        dicts = body.message_dicts()
        for i, d in enumerate(dicts):
            _check_unicode(_text(d.get("content")), f"messages.{i}.content")
        try:
            if body.uses_tools() or body.has_tool_messages():
                choice, tools = body.resolved_tool_choice(), body.tool_dicts()
                text = await run_in_threadpool(
                    render_tool_prompt,
                    self.tokenizer,
                    dicts,
                    tools,
                    choice,
                    body.parallel_tool_calls,
                    body.chat_template_kwargs,
                )
                return await run_in_threadpool(self.tokenizer.encode, text, False)
            plain = [{"role": d["role"], "content": _text(d.get("content"))} for d in dicts]
            return await run_in_threadpool(self.tokenizer.encode_chat, plain, body.chat_template_kwargs)
        except ValueError as e:
            raise APIError(400, str(e), param="messages") from e

    def tool_format(self) -> str:
        """How this model's replies carry tool calls (structured/tools.py: hermes or generic)."""
        return tool_format(self.tokenizer.chat_template)

    def check_chat(self, body: ChatCompletionRequest) -> Constraint | None:
        """The cross-field tool checks (400 naming the field), and the constraint on the reply that
        tool_choice puts (None: response_format's, if any, applies)."""
        try:
            check_tool_request(body)
            if not body.uses_tools():
                return None
            return tool_constraint(
                self.tokenizer,
                self.tool_format(),
                body.tool_dicts(),
                body.resolved_tool_choice(),
                body.parallel_tool_calls,
            )
        except (ToolRequestError, ConstraintError) as e:
            raise APIError(400, e.message, param=e.param) from e

    # -- submission ----------------------------------------------------------------------------
    def submit(
        self, body: GenerationRequest, prompt_ids: list[int], prompt: str | None, constraint: Constraint | None = None
    ) -> Submission:
        """Check the request against the server's and the engine's limits (the engine trusts what it is
        given), then queue it; nothing is queued on error. `constraint`: the tools' (else the body's)."""
        if not self.engine.alive:
            raise APIError(503, "the engine is not running", "server_error", code="engine_unavailable")
        if self.in_flight >= self.config.max_concurrent_requests:
            raise APIError(
                429,
                f"too many requests in flight (limit {self.config.max_concurrent_requests}); retry later",
                "rate_limit_error",
                code="rate_limit_exceeded",
            )
        try:  # (compiled before any model work; the grammar engine is built at server start)
            constraint = constraint or body.constraint()
        except ConstraintError as e:
            raise APIError(400, str(e), param=e.param) from e
        limits = self.engine.limits
        self._check_limits(body, prompt_ids, limits)
        try:
            limits.check_prompt(prompt_ids)
        except PromptError as e:
            raise APIError(400, str(e), param="prompt", code=e.code) from e
        try:
            params = body.sampling_params(limits.max_total_tokens - len(prompt_ids), constraint)
        except ValueError as e:
            raise APIError(400, str(e), param=str(e).split(" ", 1)[0]) from e
        request_id = f"{next(self._ids)}-{uuid.uuid4().hex[:8]}"
        outputs = self.engine.generate(EngineRequest(request_id, prompt_ids, params), body.n, prompt)
        self.metrics.prompt_tokens.inc(len(prompt_ids))
        return Submission(request_id, prompt_ids, self._counted(outputs))

    def _check_limits(self, body: GenerationRequest, prompt_ids: list[int], limits: PromptLimits) -> None:
        c = self.config
        max_n = min(c.max_n, limits.max_num_seqs)
        if body.n > max_n:
            raise APIError(400, f"n must be at most {max_n}, got {body.n}", param="n")
        stops = body.stop_strings()
        if len(stops) > c.max_stop:
            raise APIError(400, f"at most {c.max_stop} stop strings, got {len(stops)}", param="stop")
        if any(not s or len(s) > c.max_stop_chars for s in stops):
            raise APIError(400, f"stop strings must be 1..{c.max_stop_chars} characters", param="stop")
        for s in stops:
            _check_unicode(s, "stop")
        if c.max_prompt_tokens is not None and len(prompt_ids) > c.max_prompt_tokens:
            raise APIError(
                400,
                f"prompt is {len(prompt_ids)} tokens; this server accepts at most {c.max_prompt_tokens}",
                param="prompt",
                code="context_length_exceeded",
            )

    def update_metrics(self) -> None:
        """Refresh the gauges: requests in flight, and the engine's state when it runs in this process."""
        self.metrics.update_engine(self.engine.engine, self.in_flight)

    async def _counted(self, outputs: AsyncIterator[SequenceOutput]) -> AsyncIterator[SequenceOutput]:
        self.in_flight += 1
        try:
            async for out in outputs:
                yield out
        finally:
            self.in_flight -= 1
            await outputs.aclose()

    # -- results ---------------------------------------------------------------------------------
    async def collect(self, submission: Submission, raw: Request) -> dict[int, SequenceOutput]:
        """Every sample's final output; the request is aborted as soon as the client is gone."""
        finals: dict[int, SequenceOutput] = {}

        async def consume() -> None:
            async for out in submission.outputs:
                if out.finished:
                    finals[out.index] = out

        task = asyncio.ensure_future(consume())
        while not task.done():
            await asyncio.wait({task}, timeout=DISCONNECT_POLL_SECONDS)
            if not task.done() and await raw.is_disconnected():
                task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            raise APIError(499, "client disconnected") from None
        except Exception as e:
            raise engine_error(e) from e
        return finals

    async def events(
        self,
        submission: Submission,
        render: Callable[[SequenceOutput], list[dict]],
        first: list[dict],
        last: Callable[[], list[dict]],
    ) -> AsyncIterator[str]:
        """Server-sent events: `first` payloads, render(out) per engine output, last() at the end,
        then [DONE]. A failure after the stream started is sent as an error event, then [DONE]."""
        try:
            for payload in first:
                yield sse(payload)
            async for out in submission.outputs:
                for payload in render(out):
                    yield sse(payload)
            for payload in last():
                yield sse(payload)
        except Exception as e:
            yield sse(engine_error(e).body())
        yield sse("[DONE]")

    def usage(self, prompt_ids: list[int], completion_tokens: int) -> dict:
        return {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": completion_tokens,
            "total_tokens": len(prompt_ids) + completion_tokens,
        }


def engine_error(e: Exception) -> APIError:
    """The APIError a failure inside the engine is answered with."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, ValueError):
        return APIError(400, str(e))
    if isinstance(e, EngineStoppedError):
        return APIError(503, str(e), "server_error", code="engine_unavailable")
    if isinstance(e, RequestFailedError):
        return APIError(500, str(e), "server_error")
    return APIError(500, f"internal error: {type(e).__name__}", "server_error")


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


def _text(content: str | list | None) -> str:
    if isinstance(content, list):
        return "".join(part["text"] for part in content)
    return content or ""


def _check_unicode(text: str, param: str) -> None:
    """Lone surrogates (legal in JSON's \\u escapes, not in UTF-8) cannot be tokenized: 400, not 500."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"{param} is not valid Unicode text ({e.reason} at position {e.start})", param=param) from e
