"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy import text

from service.http.deps import StateDep
from service.store.engine import session_scope

router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "The database is unreachable."}})
def readyz(response: Response, state: StateDep) -> dict[str, str]:
    """Readiness: the database answers. Redis is reported but does not decide it.

    A ready pod is one that can accept events, and accepting needs only the database: an event is
    committed before its 2xx, and one whose judge task could not be queued is re-enqueued by the
    sweeper. A Redis blip hits every replica at once, so failing readiness on it would take every
    API pod out of its Service together and turn a delay in judging into refused ingest; the body
    says "degraded" instead, and the metrics and alerts show the backlog.
    """
    checks: dict[str, str] = {}
    try:
        with session_scope(state.runtime.engine) as session:
            session.execute(text("SELECT 1"))
        checks["database"] = "ok"
    except Exception as exc:
        checks["database"] = f"error: {type(exc).__name__}"
    try:
        state.runtime.redis.ping()
        checks["redis"] = "ok"
    except Exception as exc:
        checks["redis"] = f"error: {type(exc).__name__}"
    if checks["database"] != "ok":
        response.status_code = 503
        return {"status": "not ready", **checks}
    return {"status": "ready" if checks["redis"] == "ok" else "degraded", **checks}
