"""Who is calling: the tenant comes from the API key, never from the body.

With ``RM_AUTH_REQUIRED=false`` (the embedded default) every caller is the ``default`` tenant.
"""

from __future__ import annotations

from fastapi import HTTPException, Request, status
from starlette.concurrency import run_in_threadpool

from service.auth.gate import PRINCIPAL_STATE, key_from_headers
from service.auth.keys import ANONYMOUS, Principal
from service.auth.parts import AuthParts
from service.auth.scrape_token import is_scrape_token


def presented_key(request: Request) -> str | None:
    return key_from_headers(request.headers)


def current_principal(request: Request, state: AuthParts) -> Principal:
    if not state.runtime.settings.auth_required:
        return ANONYMOUS
    key = presented_key(request)
    if key is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="an API key is required (Authorization: Bearer <key> or X-API-Key)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    principal = state.keys.principal(key)
    if principal is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="unknown or revoked API key",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return principal


def operations_access(request: Request, state: AuthParts) -> None:
    """/metrics: an admin key, or the scrape token (RM_METRICS_TOKEN_FILE), is needed when keys
    are required (or RM_METRICS_AUTH says so)."""
    if not state.runtime.settings.metrics_need_key:
        return
    key = presented_key(request)
    if is_scrape_token(key, state.scrape_token):
        return
    principal = state.keys.principal(key) if key else None
    if principal is None or not principal.is_admin:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="an admin API key or the scrape token is required",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def caller_principal(request: Request, state: AuthParts) -> Principal:
    """``current_principal`` for the routes' dependency: with no key required it answers in the
    event loop (no thread-pool hop); a key lookup, which may query the database, goes to the
    thread pool."""
    if not state.runtime.settings.auth_required:
        return ANONYMOUS
    checked: Principal | None = getattr(request.state, PRINCIPAL_STATE, None)
    if checked is not None:  # the gate already looked the key up, before the body was read
        return checked
    return await run_in_threadpool(current_principal, request, state)
