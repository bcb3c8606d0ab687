"""Liveness and readiness."""

from __future__ import annotations

from collections.abc import Callable

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
    """Readiness: the database answers. Redis (and the broker, when it is apart) is reported but
    does not decide it.

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
    checks["redis"] = _answers(state.runtime.redis.ping)
    if state.runtime.settings.judge_broker_url != state.runtime.settings.redis_url:
        checks["broker"] = _answers(state.runtime.broker_queues.ping)
    if checks["database"] != "ok":
        response.status_code = 503
        return {"status": "not ready", **checks}
    degraded = any(value != "ok" for value in checks.values())
    return {"status": "degraded" if degraded else "ready", **checks}


def _answers(ping: Callable[[], object]) -> str:
    try:
        ping()
    except Exception as exc:
        return f"error: {type(exc).__name__}"
    return "ok"
