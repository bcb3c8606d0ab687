"""Identity before memory: the API key is checked from the headers, before any body is read.

An unauthenticated request to ``/v1`` is answered 401 here, so it never reaches the body limit
(which reads and inflates the body), the validation, or any counter: it costs its headers only,
and cannot move a tenant's metrics. Other paths that take a body without a key (the pages' login
form) may send at most ``max_unauthenticated_body_bytes``.

The principal found here is kept in the request's state, so the routes do not look the key up
a second time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth.keys import KeyStore, Principal
from service.auth.sessions import COOKIE_NAME, SessionStore
from service.contract.asgi_answer import send_answer
from service.ingest.otlp.responses import MEDIA_TYPES, request_encoding, status_body

PRINCIPAL_STATE = "principal"
# The tenant of a caller identified by a key or by the pages' session, for counting its rejections.
TENANT_STATE = "tenant"
# Paths whose callers are identified by an API key in a header (the ingest and read API).
KEYED_PREFIX = "/v1/"
OTLP_TRACES_PATH = "/v1/traces"
# Request state key that tells the body limit how much an unidentified caller may send.
BODY_LIMIT_STATE = "max_body_bytes"


def key_from_headers(headers: Headers) -> str | None:
    header = headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return headers.get("x-api-key") or None


def session_token(headers: Headers) -> str | None:
    raw = headers.get("cookie")
    if not raw:
        return None
    try:
        cookie = SimpleCookie(raw)
    except CookieError:
        return None
    morsel = cookie.get(COOKIE_NAME)
    return morsel.value or None if morsel is not None else None


@dataclass(frozen=True)
class Credential:
    principal: Principal | None
    from_cookie: bool  # the pages' login session rather than a key in a header


def check_credential(headers: Headers, keys: KeyStore, sessions: SessionStore) -> Credential:
    """The caller behind a key header or, failing that, the pages' session cookie."""
    key = key_from_headers(headers)
    if key is not None:
        return Credential(keys.principal(key), from_cookie=False)
    token = session_token(headers)
    if token is None:
        return Credential(None, from_cookie=False)
    digest = sessions.key_digest(token)
    return Credential(keys.principal_of_digest(digest) if digest else None, from_cookie=True)


class AuthGateMiddleware:
    """Answers 401 from the headers alone when a key is required and missing or unknown."""

    def __init__(
        self,
        app: ASGIApp,
        keys: KeyStore,
        sessions: SessionStore,
        required: bool,
        max_unauthenticated_body_bytes: int,
    ) -> None:
        self.app = app
        self.keys = keys
        self.sessions = sessions
        self.required = required
        self.max_unauthenticated_body_bytes = max_unauthenticated_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.required:
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if not str(scope.get("path", "")).startswith(KEYED_PREFIX):
            # The pages carry their own login; until identified, a caller's body stays small.
            state[BODY_LIMIT_STATE] = self.max_unauthenticated_body_bytes
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if key_from_headers(headers) is None and session_token(headers) is None:
            await refuse(
                scope, send, "an API key is required (Authorization: Bearer <key> or X-API-Key)"
            )
            return
        # The lookup may query the database: off the event loop.
        credential = await run_in_threadpool(check_credential, headers, self.keys, self.sessions)
        if credential.principal is None:
            await refuse(scope, send, "unknown or revoked API key")
            return
        state[TENANT_STATE] = credential.principal.tenant
        if not credential.from_cookie:
            # A session's changes still need the pages' header, which the routes check.
            state[PRINCIPAL_STATE] = credential.principal
        await self.app(scope, receive, send)


async def refuse(scope: Scope, send: Send, message: str) -> None:
    # Connection: close, so a client still sending a body it was refused cannot hold the
    # connection open by trickling bytes the server would only discard.
    payload = json.dumps({"detail": message}).encode()
    media_type = "application/json"
    if scope.get("path") == OTLP_TRACES_PATH:
        # An OpenTelemetry exporter reads a google.rpc.Status in its own encoding.
        headers = Headers(scope=scope)
        encoding = request_encoding(headers.get("content-type", "")) or "protobuf"
        payload = status_body(401, message, encoding)
        media_type = MEDIA_TYPES[encoding]
    await send_answer(
        send, 401, payload, media_type, close=True, headers=[(b"www-authenticate", b"Bearer")]
    )
