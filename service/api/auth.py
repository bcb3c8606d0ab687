"""Who is calling: the tenant comes from the API key, never from the body.

With ``RM_AUTH_REQUIRED=false`` (the embedded default) every caller is the ``default`` tenant.
"""

from __future__ import annotations

from fastapi import HTTPException, Request, status
from starlette.concurrency import run_in_threadpool

from service.api.keys import ANONYMOUS, Principal
from service.api.state import AppState, app_state


def presented_key(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[7:].strip() or None
    return request.headers.get("x-api-key") or None


def current_principal(request: Request, state: AppState) -> Principal:
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


def operations_access(request: Request) -> None:
    """/metrics: open unless RM_METRICS_AUTH is set, then an admin key is needed."""
    state = app_state(request)
    if not state.runtime.settings.metrics_auth:
        return
    key = presented_key(request)
    principal = state.keys.principal(key) if key else None
    if principal is None or not principal.is_admin:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="an admin API key is required",
            headers={"WWW-Authenticate": "Bearer"},
        )


async def caller_principal(request: Request) -> Principal:
    """``current_principal`` as the routes' dependency: with no key required it answers in the
    event loop (no thread-pool hop); a key lookup, which may query the database, goes to the
    thread pool."""
    state = app_state(request)
    if not state.runtime.settings.auth_required:
        return ANONYMOUS
    return await run_in_threadpool(current_principal, request, state)
