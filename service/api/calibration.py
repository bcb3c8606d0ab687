"""The local judge's calibration on the caller's gold traffic: report it, or apply it.

Applying changes the one local judge every tenant's events go through, so with API keys on it
takes an admin key; reading the report takes any key of the tenant.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, status

from service.analysis.local_calibration import NotEnoughGoldError, run_local_calibration
from service.analysis.report import to_jsonable
from service.analysis.window import resolve_window
from service.api.analysis import App, Retriever, Since, Until
from service.http.deps import Caller, StateDep
from service.http.query_params import Seed
from service.primitives.clock import utcnow
from service.store.analysis import EventWindow
from service.store.engine import session_scope

router = APIRouter(prefix="/v1/calibration", tags=["calibration"])
RESPONSES: dict[int | str, dict[str, Any]] = {
    422: {
        "description": "A malformed window, or too few gold queries (the detail says how many "
        "are needed)."
    }
}


def _calibrate(
    state: StateDep,
    tenant: str,
    since: str | None,
    until: str | None,
    app: str | None,
    retriever: str | None,
    seed: int,
    apply: bool,
) -> dict[str, Any]:
    now = utcnow()
    try:
        window_start, window_end = resolve_window(since, until, now)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from None
    settings = state.runtime.settings
    window = EventWindow(
        since=window_start,
        until=window_end,
        app=app,
        retriever=retriever,
        tenant=tenant,
        max_events=settings.max_read_events,
    )
    try:
        with session_scope(state.runtime.engine) as session:
            outcome = run_local_calibration(
                session,
                window,
                configured_thresholds=settings.local_judge_thresholds,
                seed=seed,
                apply=apply,
                now=now,
            )
            session.commit()
    except NotEnoughGoldError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc)) from None
    result: dict[str, Any] = {**to_jsonable(outcome.report), "applied": outcome.applied}
    return result


@router.get("/local-judge", responses=RESPONSES)
def get_local_calibration(
    state: StateDep,
    caller: Caller,
    since: Since = None,
    until: Until = None,
    app: App = None,
    retriever: Retriever = None,
    seed: Seed = 0,
) -> dict[str, Any]:
    """Local-judge thresholds fitted on half the gold queries, checked on the other half."""
    return _calibrate(state, caller.tenant, since, until, app, retriever, seed, apply=False)


@router.post(
    "/local-judge",
    responses={**RESPONSES, 403: {"description": "Applying needs an admin API key."}},
)
def apply_local_calibration(
    state: StateDep,
    caller: Caller,
    since: Since = None,
    until: Until = None,
    app: App = None,
    retriever: Retriever = None,
    seed: Seed = 0,
) -> dict[str, Any]:
    """Fit as the GET does, and store the thresholds: workers use them from then on."""
    if state.runtime.settings.auth_required and not caller.is_admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            detail="applying a calibration changes the judge of every tenant: an admin API key "
            "is required",
        )
    return _calibrate(state, caller.tenant, since, until, app, retriever, seed, apply=True)
