"""The coordinator's side of the target service: a GenerationBackend (speclm/server/service.py) whose
requests run in the target service, so the server's routes, limits and errors serve a deployment as they
serve `speclm serve`."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from ray.exceptions import RayActorError, RayTaskError

from speclm.engine.async_engine import EngineObserver, RequestFailedError
from speclm.engine.request import PromptLimits, Request, SequenceOutput

log = logging.getLogger(__name__)


class TargetClient:
    """Sends each request to the target service as one streamed call (`handle`: a Ray Serve handle to it)
    and hands back its outputs. A target replica that dies fails the requests it held with a
    RequestFailedError that says so; Ray Serve replaces the replica and routes new requests to live ones."""

    def __init__(self, handle, limits: PromptLimits) -> None:
        self.handle, self._limits = handle, limits
        self.observer: EngineObserver | None = None  # the engine's events stay in the target service
        self.engine = None  # no engine in this process

    @property
    def alive(self) -> bool:
        return True  # replicas come and go; Ray Serve routes to live ones

    @property
    def limits(self) -> PromptLimits:
        return self._limits

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    async def generate(self, request: Request, n: int = 1, prompt: str | None = None) -> AsyncIterator[SequenceOutput]:
        stream = self.handle.options(stream=True).generate.remote(request, n, prompt)
        done = False
        try:
            async for out in stream:
                yield out
            done = True
        except RayActorError as e:
            done = True
            log.warning("speclm deploy: a target replica died serving request %s: %s", request.request_id, e)
            raise RequestFailedError(
                "the target replica serving this request died; the request is lost (new requests go to live "
                "replicas): retry it"
            ) from e
        except RayTaskError as e:  # raised inside the target service: its own error, e.g. RequestFailedError
            done = True
            if isinstance(e.cause, (RequestFailedError, ValueError)):
                raise e.cause from e
            raise RequestFailedError(f"the target service failed this request: {type(e.cause).__name__}") from e
        finally:
            if not done:  # the client went away: stop the target's work on it
                stream.cancel()
