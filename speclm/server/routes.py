"""The OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions, /health, /metrics."""

from __future__ import annotations

import itertools
import time

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from speclm.engine.request import SequenceOutput, TokenLogprob
from speclm.server.errors import ERROR_RESPONSES, APIError
from speclm.server.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelList,
)
from speclm.server.request_fields import check_extra_fields
from speclm.server.service import GenerationService, Submission
from speclm.structured.tool_calls import ToolCallStream, parse_tool_calls

router = APIRouter()
STREAM_RESPONSE = {
    "content": {"text/event-stream": {}},
    "description": "with stream: true, server-sent events "
    "ending in `data: [DONE]` (an error after the stream started is an error event)",
}


def service_of(raw: Request) -> GenerationService:
    return raw.app.state.service


def finish_reason(out: SequenceOutput) -> str | None:
    return out.output.finish_reason if out.finished else None


def token_text(service: GenerationService, token: int) -> str:
    """A token's own text in logprobs: special tokens spelled out (skipping them would give every one
    the same empty key in a completion's top_logprobs)."""
    return service.tokenizer.decode([token], skip_special_tokens=False)


def completion_logprobs(service: GenerationService, logprobs: list[TokenLogprob] | None) -> dict | None:
    """/v1/completions' logprobs object (its legacy shape): tokens, their logprobs, the top N of each."""
    if logprobs is None:
        return None
    tokens = [token_text(service, lp.token) for lp in logprobs]
    offsets = list(itertools.accumulate((len(t) for t in tokens[:-1]), initial=0)) if tokens else []
    return {
        "tokens": tokens,
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": [{token_text(service, t): v for t, v in lp.top} for lp in logprobs],
        "text_offset": offsets,
    }


def chat_logprobs(service: GenerationService, logprobs: list[TokenLogprob] | None) -> dict | None:
    """/v1/chat/completions' logprobs object: per token its text, bytes, logprob and top_logprobs."""
    if logprobs is None:
        return None

    def entry(token: int, value: float) -> dict:
        text = token_text(service, token)
        return {"token": text, "logprob": value, "bytes": list(text.encode("utf-8"))}

    return {
        "content": [
            {**entry(lp.token, lp.logprob), "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in logprobs
        ],
        "refusal": None,
    }


@router.get("/health", responses={503: {"description": "the engine is not running"}})
async def health(raw: Request) -> JSONResponse:
    if not service_of(raw).engine.alive:
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics", response_class=Response, responses={401: ERROR_RESPONSES[401]})
async def metrics(raw: Request) -> Response:
    service = service_of(raw)
    service.update_metrics()
    return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/models", response_model=ModelList, responses={401: ERROR_RESPONSES[401]})
async def models(raw: Request) -> dict:
    service = service_of(raw)
    return {
        "object": "list",
        "data": [
            {"id": service.config.model_name, "object": "model", "created": service.created, "owned_by": "speclm"}
        ],
    }


@router.post("/v1/completions", response_model=CompletionResponse, responses={**ERROR_RESPONSES, 200: STREAM_RESPONSE})
async def completions(body: CompletionRequest, raw: Request):
    service = service_of(raw)
    check_extra_fields(body.model_extra or {})
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
        if len(prompt) != 1:
            raise APIError(400, "only one prompt per request is supported", param="prompt")
        prompt = prompt[0]
    prompt_ids = await service.encode_text(prompt) if isinstance(prompt, str) else list(prompt)
    submission = service.submit(body, prompt_ids, prompt if isinstance(prompt, str) else None)
    base = {
        "id": f"cmpl-{submission.request_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": service.config.model_name,
    }
    if body.stream:
        return _stream_completion(service, submission, body, base)
    finals = await service.collect(submission, raw)
    choices = [
        {
            "index": i,
            "text": finals[i].output.text,
            "logprobs": completion_logprobs(service, finals[i].output.logprobs),
            "finish_reason": finish_reason(finals[i]),
        }
        for i in sorted(finals)
    ]
    completion = sum(len(f.output.token_ids) for f in finals.values())
    return {**base, "choices": choices, "usage": service.usage(submission.prompt_ids, completion)}


def _stream_completion(
    service: GenerationService, submission: Submission, body: CompletionRequest, base: dict
) -> StreamingResponse:
    completion = [0]

    def render(out: SequenceOutput) -> list[dict]:
        completion[0] += len(out.token_ids)
        if not (out.text or out.finished):
            return []
        logprobs = completion_logprobs(service, out.logprobs)
        choice = {"index": out.index, "text": out.text, "logprobs": logprobs, "finish_reason": finish_reason(out)}
        return [{**base, "choices": [choice]}]

    def last() -> list[dict]:
        if body.stream_options and body.stream_options.include_usage:
            return [{**base, "choices": [], "usage": service.usage(submission.prompt_ids, completion[0])}]
        return []

    return StreamingResponse(service.events(submission, render, [], last), media_type="text/event-stream")


@router.post(
    "/v1/chat/completions", response_model=ChatCompletionResponse, responses={**ERROR_RESPONSES, 200: STREAM_RESPONSE}
)
async def chat_completions(body: ChatCompletionRequest, raw: Request):
    service = service_of(raw)
    check_extra_fields(body.model_extra or {})
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    tools_constraint = service.check_chat(body)
    prompt_ids = await service.encode_chat(body)
    submission = service.submit(body, prompt_ids, None, tools_constraint)
    base = {"id": f"chatcmpl-{submission.request_id}", "created": int(time.time()), "model": service.config.model_name}
    if body.stream:
        return _stream_chat(service, submission, body, base)
    finals = await service.collect(submission, raw)
    choices = []
    for i in sorted(finals):
        message, reason = {"role": "assistant", "content": finals[i].output.text}, finish_reason(finals[i])
        if body.uses_tools():
            parsed = parse_tool_calls(message["content"], service.tool_format())
            message["content"] = parsed.content
            if parsed.tool_calls:
                message["tool_calls"] = parsed.tool_calls
                reason = "tool_calls" if reason == "stop" else reason
        logprobs = chat_logprobs(service, finals[i].output.logprobs)
        choices.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": reason})
    completion = sum(len(f.output.token_ids) for f in finals.values())
    return {
        **base,
        "object": "chat.completion",
        "choices": choices,
        "usage": service.usage(submission.prompt_ids, completion),
    }


def _stream_chat(
    service: GenerationService, submission: Submission, body: ChatCompletionRequest, base: dict
) -> StreamingResponse:
    chunk = {**base, "object": "chat.completion.chunk"}
    completion = [0]
    first = [
        {**chunk, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        for i in range(body.n)
    ]

    # With tools, each sample's text goes through a ToolCallStream: content as it comes, each call whole
    # when it closes (as OpenAI streams them: index, id, type, function name and arguments).
    calls = {i: ToolCallStream(service.tool_format()) for i in range(body.n)} if body.uses_tools() else None
    called: set[int] = set()

    def delta(index: int, payload: dict, logprobs: dict | None = None) -> dict:
        choice = {"index": index, "delta": payload, "finish_reason": None}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        return {**chunk, "choices": [choice]}

    def render(out: SequenceOutput) -> list[dict]:
        completion[0] += len(out.token_ids)
        logprobs = chat_logprobs(service, out.logprobs)
        if calls is None:
            deltas = [{"content": out.text}] if out.text or out.logprobs else []
        else:
            stream = calls[out.index]
            deltas = stream.feed(out.text) + (stream.finish() if out.finished else [])
            called.update(out.index for d in deltas if "tool_calls" in d)
            if logprobs is not None and not deltas:
                deltas = [{"content": ""}]
        payloads = [delta(out.index, d, logprobs if j == 0 else None) for j, d in enumerate(deltas)]
        if out.finished:
            reason = finish_reason(out)
            reason = "tool_calls" if reason == "stop" and out.index in called else reason
            payloads.append({**chunk, "choices": [{"index": out.index, "delta": {}, "finish_reason": reason}]})
        return payloads

    def last() -> list[dict]:
        if body.stream_options and body.stream_options.include_usage:
            return [{**chunk, "choices": [], "usage": service.usage(submission.prompt_ids, completion[0])}]
        return []

    return StreamingResponse(service.events(submission, render, first, last), media_type="text/event-stream")
