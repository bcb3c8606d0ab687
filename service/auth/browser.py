"""Who is reading the pages: the API's key check, plus a cookie a browser can carry.

A browser cannot add an Authorization header to a page navigation, so the login form opens a
session (``service.auth.sessions``: a random token with an expiry, never the key itself) kept in an
HttpOnly, SameSite=Strict cookie, and ``ui_principal`` accepts it beside the API's two headers.
Logging out ends the session on the server. A write another site started is refused before it
gets here, for every route (``service.auth.cross_site``); changes made with the cookie (recording
a miss cause) also need the ``X-Requested-By`` header, which a cross-site form cannot set and a
cross-site fetch() can only set after a preflight this service refuses, so a browser that sends
no Sec-Fetch-Site or Origin still cannot act with the cookie from elsewhere.
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import HTTPException, Request, status

from service.auth.cross_site import SAFE_METHODS
from service.auth.gate import check_credential
from service.auth.keys import ANONYMOUS, Principal
from service.auth.parts import AuthParts
from service.auth.sessions import SESSION_SECONDS

COOKIE_MAX_AGE_SECONDS = SESSION_SECONDS
UI_HEADER = "x-requested-by"
UI_HEADER_VALUE = "retrieval-monitor-ui"


def _resolve(request: Request, state: AuthParts) -> Principal | None:
    """The caller, or None when no usable key came (the caller decides how to say so)."""
    if not state.runtime.settings.auth_required:
        return ANONYMOUS
    credential = check_credential(request.headers, state.keys, state.sessions)
    principal = credential.principal
    if principal is None:
        return None
    if (
        credential.from_cookie
        and request.method not in SAFE_METHODS
        and request.headers.get(UI_HEADER) != UI_HEADER_VALUE
    ):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail=f"a change made with the login cookie needs the {UI_HEADER} header",
        )
    return principal


def ui_principal(request: Request, state: AuthParts) -> Principal:
    """The tenant of an API call: a key in a header, or the login cookie of the pages."""
    principal = _resolve(request, state)
    if principal is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="an API key is required (Authorization: Bearer <key>, X-API-Key, or log in "
            "at /ui/login)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


def page_principal(request: Request, state: AuthParts) -> Principal:
    """The tenant of a page; without a valid key the browser is sent to the login form."""
    principal = _resolve(request, state)
    if principal is None:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(
            status.HTTP_303_SEE_OTHER,
            detail="log in first",
            headers={"Location": f"/ui/login?next={quote(target, safe='')}"},
        )
    return principal


def served_over_tls(request: Request, trust_forwarded_proto: bool) -> bool:
    """Whether the browser reached us over HTTPS, also when a TLS-terminating proxy in front
    says so in X-Forwarded-Proto (only trusted when configured: anyone can send the header)."""
    if request.url.scheme == "https":
        return True
    if not trust_forwarded_proto:
        return False
    forwarded = request.headers.get("x-forwarded-proto", "")
    return forwarded.split(",")[0].strip().lower() == "https"


def safe_next(target: str | None) -> str:
    """Where to go after logging in: only a path of the pages, never another site."""
    if target and target.startswith("/ui") and not target.startswith("//"):
        return target
    return "/ui"
