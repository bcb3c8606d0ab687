"""The batch route's body read from its bytes in one compiled pass when it is all valid.

FastAPI reads a JSON body with ``Request.json()`` and then validates what it returns against the
route's model. For the batch route that is ``json.loads`` into Python objects, then pydantic
over every event, then the storable walk over every value: most of what a batched event costs
before it is stored. ``DecodedBatchRoute`` hands the route a request whose ``json()`` first
tries ``decode_valid_batch`` (``service/contract/event_decoder.py``), which builds every event
from the bytes at once; the batch it returns carries them as ``DecodedEvents``, which the
batch model passes as they are. Whenever that decoder declines (one invalid event is enough),
``json()`` is Starlette's own, so every refusal, status and message is FastAPI's and the
models' as before: the fast reading can only ever say yes to what they say yes to.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from service.contract.event_decoder import decode_valid_batch
from service.http.state import app_state


class DecodedBatchRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            body = await self.body()
            # A batch's models take a few milliseconds to build: on a thread of the pool, so
            # the event loop goes on serving other requests meanwhile.
            events = await run_in_threadpool(
                decode_valid_batch, body, app_state(self).runtime.settings
            )
            if events is None:
                return await super().json()
            self._json = {"events": events}
        return self._json


class DecodedBatchRoute(APIRoute):
    """A route whose JSON body is read by ``DecodedBatchRequest``."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def decoded_batch_handler(request: Request) -> Response:
            return await handler(DecodedBatchRequest(request.scope, request.receive))

        return decoded_batch_handler
