"""The analysis API: the report of a window, and a comparison of two windows or retrievers."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from service.analysis.report import to_jsonable
from service.analysis.runner import (
    DEFAULT_MAX_EVENTS,
    MAX_GOLD_EVENTS,
    AnalysisRequest,
    run_analysis,
    run_comparison,
)
from service.analysis.window import parse_moment, preceding, resolve_window
from service.http.deps import Caller, StateDep
from service.http.state import AppState
from service.primitives.clock import utcnow
from service.store.analysis import EventWindow
from service.store.engine import session_scope

router = APIRouter(prefix="/v1/analysis", tags=["analysis"])

TIME_HELP = "ISO 8601 (UTC when no offset) or a span back from now: 24h, 7d, 2w"
Since = Annotated[str | None, Query(description=f"Window start; default 7d. {TIME_HELP}")]
Until = Annotated[
    str | None, Query(description=f"Window end (exclusive); default now. {TIME_HELP}")
]
App = Annotated[str | None, Query(description="Only events of this app.")]
Retriever = Annotated[str | None, Query(description="Only events of this retriever.")]
Judge = Annotated[str | None, Query(description="Whose labels to use (default: the busiest).")]
PromptVersion = Annotated[str | None, Query(description="The judge's prompt version.")]
MaxEvents = Annotated[
    int, Query(ge=1, le=1_000_000, description="Analyse at most this many of the most recent.")
]


def _bad_request(exc: ValueError) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=str(exc))


def _request(
    state: AppState,
    tenant: str,
    window: tuple[datetime, datetime],
    *,
    app: str | None,
    retriever: str | None,
    judge: str | None,
    prompt_version: str | None,
    max_events: int,
) -> AnalysisRequest:
    settings = state.runtime.settings
    return AnalysisRequest(
        window=EventWindow(
            since=window[0],
            until=window[1],
            app=app,
            retriever=retriever,
            tenant=tenant,
            max_events=min(max_events, settings.max_read_events),
        ),
        judge=judge,
        prompt_version=prompt_version,
        relevance_threshold=settings.relevance_threshold,
        alpha=settings.alpha,
        max_gold_events=min(MAX_GOLD_EVENTS, settings.max_read_events),
    )


@router.get("", responses={422: {"description": "A time or the window is malformed."}})
def get_analysis(
    state: StateDep,
    caller: Caller,
    since: Since = None,
    until: Until = None,
    app: App = None,
    retriever: Retriever = None,
    judge: Judge = None,
    prompt_version: PromptVersion = None,
    max_events: MaxEvents = DEFAULT_MAX_EVENTS,
) -> dict[str, Any]:
    """Which measure tracks answer quality, gold-traffic recall and conversion, judge vs gold."""
    try:
        window = resolve_window(since, until, utcnow())
    except ValueError as exc:
        raise _bad_request(exc) from None
    request = _request(
        state,
        caller.tenant,
        window,
        app=app,
        retriever=retriever,
        judge=judge,
        prompt_version=prompt_version,
        max_events=max_events,
    )
    with session_scope(state.runtime.engine) as session:
        report = run_analysis(session, request)
    result: dict[str, Any] = to_jsonable(report)
    return result


@router.get("/compare", responses={422: {"description": "Malformed times or retriever pair."}})
def get_comparison(
    state: StateDep,
    caller: Caller,
    since: Since = None,
    until: Until = None,
    app: App = None,
    retriever: Retriever = None,
    retriever_a: Annotated[
        str | None, Query(description="Baseline retriever (with retriever_b).")
    ] = None,
    retriever_b: Annotated[str | None, Query(description="Retriever compared with it.")] = None,
    baseline_since: Annotated[
        str | None, Query(description="Baseline window start; default: the preceding window.")
    ] = None,
    baseline_until: Annotated[str | None, Query(description="Baseline window end.")] = None,
    judge: Judge = None,
    prompt_version: PromptVersion = None,
    max_events: MaxEvents = DEFAULT_MAX_EVENTS,
) -> dict[str, Any]:
    """B against A: two retrievers in one window, or a window against its baseline window."""
    now = utcnow()
    try:
        window = resolve_window(since, until, now)
        if (retriever_a is None) != (retriever_b is None):
            raise ValueError("give both retriever_a and retriever_b, or neither")
        if retriever_a is not None and retriever_b is not None:
            windows = (window, window)
            retrievers: tuple[str | None, str | None] = (retriever_a, retriever_b)
            labels = (f"retriever {retriever_a}", f"retriever {retriever_b}")
        else:
            base = preceding(*window)
            if baseline_since or baseline_until:
                base = (
                    parse_moment(baseline_since, now) if baseline_since else base[0],
                    parse_moment(baseline_until, now) if baseline_until else base[1],
                )
                if base[0] >= base[1]:
                    raise ValueError("the baseline window is empty")
            windows = (base, window)
            retrievers = (retriever, retriever)
            labels = (_label(*base), _label(*window))
    except ValueError as exc:
        raise _bad_request(exc) from None
    a, b = (
        _request(
            state,
            caller.tenant,
            windows[i],
            app=app,
            retriever=retrievers[i],
            judge=judge,
            prompt_version=prompt_version,
            max_events=max_events,
        )
        for i in (0, 1)
    )
    with session_scope(state.runtime.engine) as session:
        report = run_comparison(session, a, b, labels)
    result: dict[str, Any] = to_jsonable(report)
    return result


def _label(since: datetime, until: datetime) -> str:
    return f"{since:%Y-%m-%d %H:%M} .. {until:%Y-%m-%d %H:%M}"
