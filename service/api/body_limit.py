"""Request bodies are bounded after decompression: a small gzip body cannot expand into memory."""

from __future__ import annotations

import json
import zlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimitMiddleware:
    """Reads the whole body up front (bounded), inflating gzip, and answers 413/415/400 itself."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in {"POST", "PUT", "PATCH"}:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding not in {"identity", "gzip", ""}:
            await _error(send, 415, f"unsupported content-encoding {encoding!r} (use gzip)")
            return
        declared = headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > self.max_bytes:
            await _error(send, 413, f"body larger than {self.max_bytes} bytes")
            return

        chunks: list[bytes] = []
        size = 0
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS) if encoding == "gzip" else None
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            data = message.get("body", b"")
            more = message.get("more_body", False)
            if inflater is not None:
                try:
                    # max_length bounds what one step may inflate to: a gzip bomb stops here.
                    data = inflater.decompress(data, self.max_bytes - size + 1)
                    if inflater.unconsumed_tail:
                        await _error(send, 413, f"body larger than {self.max_bytes} bytes")
                        return
                except zlib.error:
                    await _error(send, 400, "body is not valid gzip")
                    return
            size += len(data)
            if size > self.max_bytes:
                await _error(send, 413, f"body larger than {self.max_bytes} bytes")
                return
            chunks.append(data)
        body = b"".join(chunks)

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
        await self.app(scope, replay, send)


async def _error(send: Send, status: int, message: str) -> None:
    payload = json.dumps({"detail": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
