"""Errors in OpenAI's envelope: the exception routes raise, the handlers that answer every failure with
it, and the OpenAPI document's description of those answers."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from speclm.server.protocol import ErrorResponse, error_body

# Status -> what the OpenAPI document says it means, for the generation endpoints.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": description}
    for status, description in (
        (400, "invalid request: a bad field, a prompt too long for the context, a limit exceeded"),
        (401, "missing or wrong API key"),
        (413, "request body larger than the server's limit"),
        (429, "too many requests in flight"),
        (500, "the engine failed this request (the server keeps serving)"),
        (503, "the engine is not running"),
    )
}


class APIError(Exception):
    """An error answered with the OpenAI envelope and `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def body(self) -> dict:
        return error_body(self.message, self.kind, self.param, self.code)

    def response(self) -> JSONResponse:
        headers = {"Retry-After": "1"} if self.status == 429 else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def _field_names() -> set[str]:
    from speclm.server import protocol, tool_protocol

    models = (
        protocol.CompletionRequest,
        protocol.ChatCompletionRequest,
        protocol.StreamOptions,
        protocol.StructuredOutputs,
        *(
            getattr(tool_protocol, name)
            for name in dir(tool_protocol)
            if isinstance(getattr(tool_protocol, name), type) and issubclass(getattr(tool_protocol, name), BaseModel)
        ),
    )
    return {name for model in models for name in model.model_fields}


FIELD_NAMES = _field_names()
ROLE_TAGS = {"system", "developer", "user", "assistant", "tool"}


def _param(loc: tuple) -> str | None:
    """The field path of an error location, without pydantic's union-member tags ('str', 'list[int]')."""
    parts = []
    for part in loc[1:] if loc and loc[0] == "body" else loc:
        if part in ROLE_TAGS and parts and parts[-1].isdigit():  # a message's union tag: its role
            continue
        if not (isinstance(part, int) or part in FIELD_NAMES):
            break
        parts.append(str(part))
    return ".".join(parts) or None


def validation_message(error: RequestValidationError) -> tuple[str, str | None]:
    """(message, param) of the first field pydantic rejected. For a union field its members each
    report; a member whose type fits (its error is not a type mismatch) says best what is wrong."""
    errors = error.errors()
    if not errors:
        return "invalid request", None
    if errors[0].get("type") == "json_invalid":
        return f"malformed JSON body: {errors[0].get('ctx', {}).get('error', 'decode error')}", None
    param = _param(tuple(errors[0].get("loc", ())))
    same = [e for e in errors if _param(tuple(e.get("loc", ()))) == param]
    best = next((e for e in same if not str(e.get("type", "")).endswith("_type")), same[0])
    return f"{param + ': ' if param else ''}{best.get('msg', 'invalid value')}", param


def install_error_handlers(app: FastAPI) -> None:
    """Every failure the app can meet becomes an OpenAI-schema JSON error with the right status."""

    @app.exception_handler(APIError)
    async def api_error(_request: Request, e: APIError) -> JSONResponse:
        return e.response()

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, e: RequestValidationError) -> JSONResponse:
        message, param = validation_message(e)
        return APIError(400, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, e: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(error_body(str(e.detail), kind), status_code=e.status_code, headers=e.headers)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, e: Exception) -> JSONResponse:
        return APIError(500, f"internal error: {type(e).__name__}", "server_error").response()


def openapi_with_error_responses(app: FastAPI) -> dict:
    """FastAPI's OpenAPI document, minus the 422 it adds for body validation (this server answers 400)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for operations in schema.get("paths", {}).values():
            for operation in operations.values():
                operation.get("responses", {}).pop("422", None)
        components = schema.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            components.pop(unused, None)
        app.openapi_schema = schema
    return app.openapi_schema
