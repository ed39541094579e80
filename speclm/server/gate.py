"""The server's door, as plain ASGI middleware: API key, body size limit, request counting.

Plain ASGI rather than Starlette's BaseHTTPMiddleware: that one runs the route in a separate task
and hides the client's disconnect from it, so abandoned requests ran to the end.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable

from speclm.server.config import ServerConfig
from speclm.server.errors import APIError

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
ASGIApp = Callable[[dict, Callable, Callable], Awaitable[None]]


def key_matches(header: str | None, api_key: str) -> bool:
    """`Authorization: Bearer KEY` (scheme case-insensitive), compared in constant time."""
    scheme, _, token = (header or "").strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


class Gate:
    """Checks the key on /v1/ (and /metrics unless it is open), reads the body up to the size limit
    (413 beyond it, before any parsing), and counts generation requests by status (`on_status`)."""

    def __init__(self, app: ASGIApp, config: ServerConfig, on_status: Callable[[str, int], None]) -> None:
        self.app, self.config, self.on_status = app, config, on_status

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        status = {"code": 0}

        async def send_counted(message: dict) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            self._check_key(path, dict(scope["headers"]).get(b"authorization"))
            body = await self._read_body(scope, receive)
        except APIError as e:
            await self._answer(send_counted, e)
        else:
            await self.app(scope, _replay(body, receive), send_counted)
        finally:
            if path in GENERATION_PATHS and status["code"]:
                self.on_status(path, status["code"])

    def _check_key(self, path: str, header: bytes | None) -> None:
        key = self.config.api_key
        protected = path.startswith("/v1/") or (path == "/metrics" and not self.config.metrics_open)
        if key and protected and not key_matches(header.decode("latin-1") if header else None, key):
            raise APIError(
                401,
                "invalid or missing API key (send 'Authorization: Bearer KEY')",
                "authentication_error",
                code="invalid_api_key",
            )

    async def _read_body(self, scope: dict, receive: Callable) -> bytes:
        limit = self.config.max_body_bytes
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise _too_large(limit)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)

    @staticmethod
    async def _answer(send: Callable, error: APIError) -> None:
        body = json.dumps(error.body()).encode()
        await send(
            {
                "type": "http.response.start",
                "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body is larger than this server's limit of {limit} bytes", code="request_too_large")


def _replay(body: bytes, receive: Callable) -> Callable:
    """A receive that hands the app the body read so far, then the client's further messages
    (so the route still learns of a disconnect)."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
