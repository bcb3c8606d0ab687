"""An answer sent straight from an ASGI middleware, before any route runs: the guards that
refuse a request from its headers, its query string or its body's size use it."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.types import Send


async def send_answer(
    send: Send,
    status: int,
    payload: bytes,
    media_type: str = "application/json",
    *,
    close: bool = False,
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> None:
    """Send a whole answer. ``close``: the request's body may be unread or half read, so the
    connection cannot carry another request."""
    head = [
        (b"content-type", media_type.encode()),
        (b"content-length", str(len(payload)).encode()),
        *headers,
    ]
    if close:
        head.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": payload})
