"""Request bodies are bounded after decompression, in time, and all together.

- One body: at most ``max_bytes`` once inflated (less for a caller not yet identified, see
  ``service.auth.gate``), so a small gzip body cannot expand into memory.
- One body in time: a client that has not sent its whole body within ``timeout_seconds`` is
  answered 408 and its connection closed, so a half-sent request cannot stay open.
- One body's work: a JSON body may hold at most ``max_items`` items nested at most
  ``max_depth`` deep (``service/contract/json_shape.py``), counted on its bytes before anything is
  decoded, and answered 413 past either; decoding costs memory by the item, not the byte.
- All bodies at once: what requests still being read or handled hold, their bytes and what
  their items will cost decoded (``DECODED_BYTES_PER_ITEM`` each), never exceeds the
  ``InflightBudget``; past it a request is answered 503 with Retry-After. This is the bound on
  what slow or hostile clients can make the process hold together.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth.gate import BODY_LIMIT_STATE
from service.contract.asgi_answer import send_answer
from service.contract.json_shape import json_shape

RETRY_AFTER_SECONDS = 2
# What one JSON item costs once decoded and validated, at most: measured for the worst body of
# every route (tests/integration/api/test_decoding_memory.py), with room to spare.
DECODED_BYTES_PER_ITEM = 512


class InflightBudget:
    """Bytes of request bodies held in the process; the event loop is single-threaded, so a
    plain counter needs no lock."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, size: int) -> bool:
        if self.held + size > self.limit:
            return False
        self.held += size
        return True

    def give_back(self, size: int) -> None:
        self.held -= size


class BodyLimitMiddleware:
    """Reads the whole body up front (bounded), inflating gzip, and answers 413/415/400/408/503
    itself."""

    def __init__(
        self,
        app: ASGIApp,
        max_bytes: int,
        timeout_seconds: float = 30.0,
        budget: InflightBudget | None = None,
        max_items: int = 100_000,
        max_depth: int = 64,
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_seconds = timeout_seconds
        self.budget = budget or InflightBudget(max_bytes * 8)
        self.max_items = max_items
        self.max_depth = max_depth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in {"POST", "PUT", "PATCH"}:
            await self.app(scope, receive, send)
            return
        held = 0
        try:
            body = await self._read(scope, receive, send)
            if body is None:
                return
            held = len(body.data)
            decoded = await self._decoding_cost(body, send)
            if decoded is None:
                return
            held += decoded
            await self.app(body.scope, body.replay, send)
        finally:
            self.budget.give_back(held)

    async def _decoding_cost(self, body: _Body, send: Send) -> int | None:
        """What decoding the body will cost, taken from the budget; None once answered."""
        content_type = _header(body.scope, b"content-type")
        if "json" not in content_type and content_type.strip():
            return 0  # a form (bounded by its parser) or protobuf (by its decoder)
        shape = json_shape(body.data, self.max_items, self.max_depth)
        if shape.items > self.max_items:
            await _error(
                send,
                413,
                f"body holds {shape.items} JSON items > max_body_items {self.max_items}",
            )
            return None
        if shape.depth > self.max_depth:
            await _error(
                send,
                413,
                f"body nests {shape.depth} levels deep > max_body_depth {self.max_depth}",
            )
            return None
        cost = shape.items * DECODED_BYTES_PER_ITEM
        if len(body.data) + cost > self.budget.limit:  # would never fit: retrying cannot help
            await _error(
                send,
                413,
                f"body would hold about {len(body.data) + cost} bytes decoded > "
                f"max_inflight_body_bytes {self.budget.limit}",
            )
            return None
        if not self.budget.take(cost):
            await _over_budget(send)
            return None
        return cost

    async def _read(self, scope: Scope, receive: Receive, send: Send) -> _Body | None:
        state = scope.get("state", {})
        max_bytes = min(self.max_bytes, state.get(BODY_LIMIT_STATE, self.max_bytes))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in {"identity", "gzip", ""}:
            await _error(send, 415, f"unsupported content-encoding {encoding!r} (use gzip)")
            return None
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > max_bytes:
            await _error(send, 413, f"body larger than {max_bytes} bytes")
            return None

        chunks: list[bytes] = []
        size = 0
        taken = 0
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
        deadline = time.monotonic() + self.timeout_seconds
        more = True
        try:
            while more:
                try:
                    message = await asyncio.wait_for(receive(), deadline - time.monotonic())
                except TimeoutError:
                    await _error(
                        send, 408, f"request body not received within {self.timeout_seconds:g} s"
                    )
                    return None
                if message["type"] == "http.disconnect":
                    return None
                data = message.get("body", b"")
                more = message.get("more_body", False)
                if inflater is not None:
                    try:
                        # max_length bounds what one step may inflate to: a gzip bomb stops here.
                        data = inflater.decompress(data, max_bytes - size + 1)
                        if inflater.unconsumed_tail:
                            await _error(send, 413, f"body larger than {max_bytes} bytes")
                            return None
                    except zlib.error:
                        await _error(send, 400, "body is not valid gzip")
                        return None
                size += len(data)
                if size > max_bytes:
                    await _error(send, 413, f"body larger than {max_bytes} bytes")
                    return None
                if not self.budget.take(len(data)):
                    await _over_budget(send)
                    return None
                taken += len(data)
                chunks.append(data)
            body = b"".join(chunks)
        finally:
            # What was taken chunk by chunk is handed back here; the caller takes the whole
            # body again for as long as the app holds it.
            self.budget.give_back(taken)
        self.budget.held += len(body)  # held by the app until it answers

        sent = False

        async def replay() -> Message:
            nonlocal sent
            if sent:
                return await receive()  # blocks until the client really disconnects
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        if inflater is not None:
            scope = dict(scope)
            scope["headers"] = [
                (k, v)
                for k, v in scope["headers"]
                if k.lower() not in {b"content-encoding", b"content-length"}
            ] + [(b"content-length", str(len(body)).encode())]
        return _Body(scope, body, replay)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return str(value.decode("latin-1")).lower()
    return ""


class _Body:
    def __init__(self, scope: Scope, data: bytes, replay: Receive) -> None:
        self.scope = scope
        self.data = data
        self.replay = replay


async def _over_budget(send: Send) -> None:
    await _error(
        send, 503, "too many request bodies in flight; retry later", retry_after=RETRY_AFTER_SECONDS
    )


async def _error(send: Send, status: int, message: str, retry_after: int | None = None) -> None:
    payload = json.dumps({"detail": message}).encode()
    # The body may be half read: the connection cannot carry another request.
    headers = [] if retry_after is None else [(b"retry-after", str(retry_after).encode())]
    await send_answer(send, status, payload, close=True, headers=headers)
