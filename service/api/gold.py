"""The gold API: mark after the fact which passages answer an event's query (or that none
does), read an event's labels, and the labellers' agreement over a window.

Tenant-scoped like feedback: another tenant's event is a 404. Who labelled is the API key
(``key:<id>``) or, when the service needs no key, the ``labeller`` named in the body. The routes
take the pages' login cookie too, so the labelling page posts here.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query, status

from service.analysis.gold_queue import window_agreement
from service.analysis.report import to_jsonable
from service.analysis.window import resolve_window
from service.auth.labellers import labeller_of
from service.contract.schemas import ERROR_RESPONSES, EventGoldView, GoldIn, GoldLabelView
from service.contract.storable import text_problem
from service.http.deps import StateDep, UiCaller
from service.primitives.clock import utcnow
from service.primitives.hashing import text_hash
from service.store import events as event_store
from service.store import gold as gold_store
from service.store import pages as page_store
from service.store.analysis import EventWindow
from service.store.engine import session_scope
from service.store.models import Event, GoldOutcome, MissCauseKind

router = APIRouter(tags=["gold"], responses=ERROR_RESPONSES)

# Outcomes that say why gold is missing, recorded as the miss's cause when none is yet.
CAUSE_OF_OUTCOME = {
    GoldOutcome.NOT_IN_CORPUS.value: MissCauseKind.NOT_IN_CORPUS,
    GoldOutcome.AMBIGUOUS.value: MissCauseKind.AMBIGUOUS_QUESTION,
}


def _unprocessable(message: str) -> HTTPException:
    return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=message)


def _find(session: Any, tenant: str, event_id: str) -> Event:
    event = event_store.find_event(session, tenant, event_id)
    if event is None or event.id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no event {event_id!a}")
    return event


def checked_label(
    body: GoldIn, event: Event, sent: list[str], labeller: tuple[str, str], max_chars: int
) -> gold_store.LabelRow:
    """The label to store, or a 422 saying what does not fit the event."""
    assert event.id is not None
    passage_ids = list(dict.fromkeys(body.passage_ids))
    missing_text: str | None = None
    if body.outcome == GoldOutcome.ANSWERED.value:
        unknown = [p for p in passage_ids if p not in sent]
        if unknown:
            raise _unprocessable(
                f"passage ids not among the {len(sent)} the event sent: {unknown[:10]!a}; "
                "a passage that was not sent is outcome not_retrieved with missing_passage"
            )
    elif body.missing_passage is not None:
        missing = body.missing_passage
        missing_text = missing.text
        if missing_text is not None and len(missing_text) > max_chars:
            raise _unprocessable(
                f"missing_passage.text is {len(missing_text)} characters, over "
                f"max_passage_chars {max_chars}"
            )
        derived = (
            missing.id
            if missing.id is not None
            else event_store.passage_key(None, text_hash(missing_text or ""))
        )
        if derived in sent:
            raise _unprocessable(
                f"passage {derived!a} was sent with the event: mark it with outcome answered"
            )
        passage_ids = [derived]
    return gold_store.LabelRow(
        event_pk=event.id,
        labeller=labeller[0],
        labeller_name=labeller[1],
        outcome=body.outcome,
        passage_ids=tuple(passage_ids),
        missing_text=missing_text,
        answer_correct=body.answer_correct,
        labelled_at=utcnow(),
    )


def _label_view(event_id: str, row: gold_store.LabelRow) -> GoldLabelView:
    return GoldLabelView(
        event_id=event_id,
        labeller=row.labeller,
        labeller_name=row.labeller_name,
        outcome=row.outcome,
        passage_ids=list(row.passage_ids),
        missing_text=row.missing_text,
        answer_correct=row.answer_correct,
        labelled_at=row.labelled_at,
    )


def event_gold(session: Any, event: Event) -> EventGoldView:
    assert event.id is not None
    labels = gold_store.labels_of(session, [event.id]).get(event.id, [])
    agreed = gold_store.consensus(event.gold_passage_ids, event.answer_correct, labels)
    return EventGoldView(
        event_id=event.event_id,
        labels=[_label_view(event.event_id, row) for row in labels],
        status=agreed.status,
        gold_passage_ids=agreed.gold_passage_ids,
        answer_correct=agreed.answer_correct,
    )


@router.post(
    "/v1/events/{event_id}/gold",
    response_model=EventGoldView,
    responses={
        404: {},
        409: {"description": "The event was stored without its texts (RM_KEEP_TEXTS=needed)."},
        422: {"description": "Malformed, or passages the event did not send."},
    },
)
def post_gold(event_id: str, body: GoldIn, state: StateDep, caller: UiCaller) -> EventGoldView:
    """Mark the passages that answer the event's query, or why none does; labelling the same
    event again replaces this labeller's earlier label (other labellers' stay)."""
    if text_problem(event_id) is not None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no event {event_id!a}")
    labeller = labeller_of(caller, body.labeller)
    with session_scope(state.runtime.engine) as session:
        event = _find(session, caller.tenant, event_id)
        assert event.id is not None
        if not event.texts_kept:
            # Its passages were not stored: the analysis would read the label against an empty
            # retrieval and count a miss that never happened.
            raise HTTPException(
                status.HTTP_409_CONFLICT,
                detail=f"event {event_id!a} was stored without its query and passages "
                "(RM_KEEP_TEXTS=needed: it was not chosen for judging), so there is nothing to "
                "mark against; label an event that kept its texts, or set RM_KEEP_TEXTS=all",
            )
        sent = [p.passage_id for p in event_store.stored_event(session, event).passages]
        row = checked_label(body, event, sent, labeller, state.runtime.settings.max_passage_chars)
        gold_store.save_label(session, row)
        cause = CAUSE_OF_OUTCOME.get(row.outcome)
        if cause is not None and page_store.find_cause(session, event.id) is None:
            page_store.record_cause(session, event.id, cause, None, row.labelled_at)
        session.commit()
        return event_gold(session, event)


@router.get("/v1/events/{event_id}/gold", response_model=EventGoldView, responses={404: {}})
def get_gold(event_id: str, state: StateDep, caller: UiCaller) -> EventGoldView:
    """The event's labels, and the gold the analysis takes from them."""
    with session_scope(state.runtime.engine) as session:
        return event_gold(session, _find(session, caller.tenant, event_id))


@router.get("/v1/gold/agreement")
def get_agreement(
    state: StateDep,
    caller: UiCaller,
    since: Annotated[str, Query(description="Window start (ISO 8601 or 24h, 7d...).")] = "30d",
    until: Annotated[str | None, Query(description="Window end (exclusive); default now.")] = None,
    app: Annotated[str | None, Query(description="Only events of this app.")] = None,
    retriever: Annotated[str | None, Query(description="Only events of this retriever.")] = None,
) -> dict[str, Any]:
    """Cohen's kappa between labellers over (event, passage) decisions, per pair and pooled,
    and how many events labelled twice or more the labellers agreed on (the others leave the
    gold set)."""
    try:
        start, end = resolve_window(since, until, utcnow())
    except ValueError as exc:
        raise _unprocessable(str(exc)) from exc
    window = EventWindow(start, end, app=app, retriever=retriever, tenant=caller.tenant)
    with session_scope(state.runtime.engine) as session:
        found = window_agreement(session, window)
    return {"since": start, "until": end, **to_jsonable(found)}
