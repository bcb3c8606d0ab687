"""The miss-cause API: record why a gold miss happened, and count misses by cause."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from service.contract.schemas import ERROR_RESPONSES
from service.http.deps import StateDep, UiCaller
from service.primitives.clock import as_utc, utcnow
from service.store import events as event_store
from service.store import gold as gold_store
from service.store import pages as page_store
from service.store.engine import session_scope
from service.store.models import Event, MissCause, MissCauseKind
from service.store.pages import UNCLASSIFIED
from service.ui.filters import EventFilter, TimeWindow
from service.ui.schemas import CauseCountsView, MissCauseIn, MissCauseView

# A malformed query answers the application's error body, as every other router documents.
router = APIRouter(tags=["misses"], responses={422: ERROR_RESPONSES[422]})


def _view(event: Event, cause: MissCause) -> MissCauseView:
    return MissCauseView(
        event_id=event.event_id,
        cause=MissCauseKind(cause.cause),
        note=cause.note,
        recorded_at=cause.recorded_at,
    )


@router.put(
    "/v1/events/{event_id}/miss-cause",
    response_model=MissCauseView,
    responses={404: {}, 422: {"description": "Not a gold miss, or a malformed cause."}},
)
def put_miss_cause(
    event_id: str, body: MissCauseIn, state: StateDep, caller: UiCaller
) -> MissCauseView:
    """Record why the event's gold passage did not reach the prompt; replaces an earlier cause."""
    with session_scope(state.runtime.engine) as session:
        event = event_store.find_event(session, caller.tenant, event_id)
        if event is None or event.id is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no event {event_id!r}")
        if not page_store.is_gold_miss(session, event.id) and not labelled_miss(session, event):
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                detail=f"event {event_id!r} is not a gold miss: it has no gold passage ids, or "
                "one of them reached the prompt",
            )
        cause = page_store.record_cause(session, event.id, body.cause, body.note, utcnow())
        session.commit()
    return _view(event, cause)


def labelled_miss(session: Any, event: Event) -> bool:
    """The gold people marked (``service.store.gold``) missed the prompt, or says nothing in the
    corpus answers: a miss whose cause is worth recording."""
    assert event.id is not None
    labels = gold_store.labels_of(session, [event.id]).get(event.id, [])
    agreed = gold_store.consensus(None, None, labels)
    if agreed.outcome in gold_store.WITHOUT_GOLD:
        return True
    if not agreed.gold_passage_ids:
        return False
    prompt = [p.passage_id for p in event_store.stored_event(session, event).passages][: event.k]
    return not set(agreed.gold_passage_ids) & set(prompt)


@router.get("/v1/events/{event_id}/miss-cause", response_model=MissCauseView, responses={404: {}})
def get_miss_cause(event_id: str, state: StateDep, caller: UiCaller) -> MissCauseView:
    """The cause recorded for the event's gold miss; 404 when none is."""
    with session_scope(state.runtime.engine) as session:
        event = event_store.find_event(session, caller.tenant, event_id)
        if event is None or event.id is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no event {event_id!r}")
        cause = page_store.find_cause(session, event.id)
    if cause is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND, detail=f"no cause recorded for event {event_id!r}"
        )
    return _view(event, cause)


@router.get("/v1/misses/causes", response_model=CauseCountsView)
def get_cause_counts(
    state: StateDep,
    caller: UiCaller,
    app: Annotated[str | None, Query(description="Only events of this app.")] = None,
    retriever: Annotated[str | None, Query(description="Only events of this retriever.")] = None,
    since: Annotated[
        datetime | None, Query(description="Received at or after (ISO 8601; UTC if no offset).")
    ] = None,
    until: Annotated[datetime | None, Query(description="Received before (ISO 8601).")] = None,
) -> CauseCountsView:
    """Gold misses counted by recorded cause, to choose the next fix by numbers."""
    chosen = EventFilter(
        window=TimeWindow("custom", as_utc(since), as_utc(until)), app=app, retriever=retriever
    )
    with session_scope(state.runtime.engine) as session:
        counts = page_store.cause_counts(session, caller.tenant, chosen)
    return CauseCountsView(
        gold_events=counts.gold_events,
        misses=counts.misses,
        classified=counts.classified,
        unclassified=counts.by_cause[UNCLASSIFIED],
        causes={kind: counts.by_cause[kind.value] for kind in MissCauseKind},
    )
