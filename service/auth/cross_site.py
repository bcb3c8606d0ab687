"""One refusal of cross-site writes, for every route of the application.

A page on another site can make a visitor's browser send a form POST, or a "simple" fetch()
without a preflight, to this service. With API keys off (the embedded default) such a request
needs no credential at all, and with keys on it carries the pages' cookie when the browser is
lenient about SameSite. So every request that can change state (any method but GET, HEAD and
OPTIONS) that a browser marks as started by another site is answered 403 here, before routing,
before the key check and before any body is read: a route added later is covered without a line
of its own.

What marks it is what the browser sets and a page cannot forge: ``Sec-Fetch-Site`` when sent,
else ``Origin`` compared with ``Host``. Clients that are not browsers send neither and pass, as
does a request presenting a key in a header: a page elsewhere can only add such a header through
a CORS preflight, which this service never grants.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from service.auth.gate import key_from_headers
from service.contract.asgi_answer import send_answer

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What a browser sends for a request started by this very site, a sibling on the same site, or
# the user themselves (an address typed in, a bookmark).
OWN_FETCH_SITES = frozenset({"same-origin", "same-site", "none"})
REFUSAL = (
    "cross-site request refused: a page on another site cannot change anything here "
    "(send the request from this service's own pages, or from a client that is not a browser)"
)


def cross_site(headers: Headers) -> bool:
    """True when the browser says the request was started by another site."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site.strip().lower() not in OWN_FETCH_SITES
    origin = headers.get("origin")
    if origin is None:
        return False
    # "null" is what a sandboxed frame or a data: page sends: never this site.
    if origin.strip() == "null":
        return True
    return urlsplit(origin.strip()).netloc.lower() != headers.get("host", "").lower()


def refused_as_cross_site(method: str, headers: Headers) -> bool:
    """Whether a request must be refused: a write, from a browser, started by another site."""
    if method.upper() in SAFE_METHODS:
        return False
    if key_from_headers(headers) is not None:
        return False
    return cross_site(headers)


class CrossSiteWriteGuard:
    """Answers 403 to a cross-site state-changing request, whatever route it is for."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not refused_as_cross_site(
            str(scope.get("method", "GET")), Headers(scope=scope)
        ):
            await self.app(scope, receive, send)
            return
        # The body, if any, is never read: the connection is not kept for the next request.
        await send_answer(send, 403, json.dumps({"detail": REFUSAL}).encode(), close=True)
