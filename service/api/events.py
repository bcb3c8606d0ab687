"""The v1 event API."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, HTTPException, Response, status
from starlette.concurrency import run_in_threadpool

from service.auth.keys import Principal
from service.contract.schemas import (
    ERROR_RESPONSES,
    BatchIn,
    BatchResult,
    ErrorBody,
    EventIn,
    EventView,
    FeedbackIn,
    IngestResult,
    PassageView,
    check_feedback_limits,
)
from service.contract.validate import Rejection, validate
from service.http.decoded_batch import DecodedBatchRoute
from service.http.deps import Caller, StateDep
from service.http.state import AppState
from service.ingest.admission import Refusal
from service.ingest.counts import add_counts, count_refused
from service.ingest.group_commit import NotStoredError
from service.ingest.ingestor import CONFLICT_MESSAGE
from service.measures.catalogue import MEASURE_NAMES
from service.measures.formulas import first_gold_ranks
from service.store import events as event_store
from service.store.engine import session_scope
from service.telemetry.aggregates import Delta

router = APIRouter(prefix="/v1/events", tags=["events"], responses=ERROR_RESPONSES)

# OpenAPI links: what a client (or a stateful test) can do next with the event_id of an answer.
_EVENT_LINKS = {
    "GetEvent": {
        "operationId": "get_event_v1_events__event_id__get",
        "parameters": {"event_id": "$response.body#/event_id"},
    },
    "PostFeedback": {
        "operationId": "post_feedback_v1_events__event_id__feedback_post",
        "parameters": {"event_id": "$response.body#/event_id"},
    },
}


@router.post(
    "",
    response_model=IngestResult,
    status_code=status.HTTP_202_ACCEPTED,
    responses={
        202: {"description": "Committed; judged in the background.", "links": _EVENT_LINKS},
        200: {
            "model": IngestResult,
            "description": "Already known: nothing new was stored.",
            "links": _EVENT_LINKS,
        },
        409: {"model": ErrorBody, "description": "The event_id is used by a different event."},
        413: {"model": ErrorBody, "description": "The body is over max_body_bytes."},
        429: {"model": ErrorBody, "description": "The tenant is over its rate; see Retry-After."},
        422: {"description": "The event is malformed or breaks a limit."},
    },
)
async def post_event(
    event: EventIn, response: Response, state: StateDep, caller: Caller
) -> IngestResult:
    """Accept one retrieval event; 202 once it is committed, to be judged in the background."""
    # A coroutine, so a request costs no thread-pool hop: it awaits its commit on the event loop.
    # Whatever may block (a query, a Redis call) is sent to the thread pool instead; validation
    # and redaction are CPU work on a body already parsed here, so they stay.
    await refuse_single_if_needed(state, caller)
    checked = validate(event, state.runtime.settings, state.runtime.redactor)
    if isinstance(checked, Rejection):
        await run_in_threadpool(state.ingestor.ingest, caller.tenant, [], [checked])
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail=checked.message)
    # Committed together with the events of concurrent requests (service/ingest/group_commit.py).
    try:
        result = await state.committer.store(caller.tenant, checked)
    except NotStoredError as exc:
        await run_in_threadpool(count_refused, state.runtime.aggregates, caller.tenant, exc.reason)
        retry_after = str(state.runtime.settings.backpressure_retry_after_seconds)
        raise HTTPException(
            exc.status_code,
            detail=str(exc),
            headers={"Retry-After": retry_after} if exc.status_code == 503 else None,
        ) from exc
    if result.status == "duplicate":
        response.status_code = status.HTTP_200_OK
    elif result.status == "rejected":
        conflict = result.error == CONFLICT_MESSAGE
        raise HTTPException(
            status.HTTP_409_CONFLICT if conflict else status.HTTP_422_UNPROCESSABLE_CONTENT,
            detail=result.error,
        )
    return result


def post_batch(batch: BatchIn, state: StateDep, caller: Caller) -> BatchResult:
    """Accept many events; each is validated on its own and gets its own result."""
    # The count of events was checked against max_batch_events before any was read (BatchIn).
    refuse_if_needed(state, caller, len(batch.events))
    # Raw events, or events already built from the body's bytes (service/http/decoded_batch.py),
    # which ``validate`` takes on from their limits.
    events: Sequence[dict[str, Any] | EventIn] = batch.events
    valid: list[EventIn] = []
    slots: list[int | Rejection] = []
    for raw in events:
        checked = validate(raw, state.runtime.settings, state.runtime.redactor)
        if isinstance(checked, Rejection):
            slots.append(checked)
        else:
            slots.append(len(valid))
            valid.append(checked)
    rejections = [slot for slot in slots if isinstance(slot, Rejection)]
    stored = state.ingestor.ingest(caller.tenant, valid, rejections)
    results = [
        IngestResult(event_id=slot.event_id, status="rejected", error=slot.message)
        if isinstance(slot, Rejection)
        else stored[slot]
        for slot in slots
    ]
    return BatchResult(
        accepted=sum(r.status == "accepted" for r in results),
        duplicate=sum(r.status == "duplicate" for r in results),
        rejected=sum(r.status == "rejected" for r in results),
        results=results,
    )


# Its body is read from the bytes in one compiled pass when every event is valid.
router.add_api_route(
    "/batch",
    post_batch,
    methods=["POST"],
    response_model=BatchResult,
    route_class_override=DecodedBatchRoute,
)


@router.get("/{event_id}", response_model=EventView, responses={404: {"model": ErrorBody}})
def get_event(event_id: str, state: StateDep, caller: Caller) -> EventView:
    """The event as stored, its judging status, per-passage grades and its measures."""
    with session_scope(state.runtime.engine) as session:
        event = event_store.find_event(session, caller.tenant, event_id)
        if event is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no event {event_id!a}")
        stored = event_store.stored_event(session, event)
    return _view(stored)


@router.post("/{event_id}/feedback", responses={404: {"model": ErrorBody}})
def post_feedback(
    event_id: str, feedback: FeedbackIn, state: StateDep, caller: Caller
) -> dict[str, Any]:
    """Attach the answer's grade (1-5) and/or correctness to an event, possibly long after it."""
    problems = check_feedback_limits(feedback, state.runtime.settings)
    if problems:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, detail="; ".join(problems))
    with session_scope(state.runtime.engine) as session:
        event = event_store.find_event(session, caller.tenant, event_id)
        if event is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no event {event_id!a}")
        event_store.record_feedback(session, event, feedback)
        session.commit()
        labels = {"app": event.app, "retriever": event.retriever, "environment": event.environment}
    delta = Delta(caller.tenant)
    delta.inc("feedback", labels)
    add_counts(state.runtime.aggregates, delta)
    return {"event_id": event_id, "status": "recorded"}


def refuse_if_needed(state: AppState, caller: Principal, events: int) -> None:
    refusal = state.admission.admit(caller.tenant, events)
    if refusal is not None:
        raise _refused(refusal)


async def refuse_single_if_needed(state: AppState, caller: Principal) -> None:
    """``refuse_if_needed`` for one event, from the event loop. Mostly admission is decided on
    cached figures (the backlog count is re-read once a second): then it is decided in place, a
    thread-pool hop costing more than the check. A stale count (its COUNT query) or a tenant
    rate (its token bucket in Redis) sends the whole check to the thread pool, and so does
    counting a refusal (Redis)."""
    admission = state.admission
    if admission.admits_without_io():
        refusal = admission.refusal(caller.tenant, 1, refresh=False)
        if refusal is not None:
            await run_in_threadpool(
                count_refused, state.runtime.aggregates, caller.tenant, refusal.reason
            )
    else:
        refusal = await run_in_threadpool(admission.admit, caller.tenant, 1)
    if refusal is not None:
        raise _refused(refusal)


def _refused(refusal: Refusal) -> HTTPException:
    return HTTPException(
        refusal.status_code,
        detail=refusal.message,
        headers={"Retry-After": str(refusal.retry_after_seconds)},
    )


def _view(stored: event_store.StoredEvent) -> EventView:
    event, score = stored.event, stored.score
    gold = set(event.gold_passage_ids) if event.gold_passage_ids else None
    gold_ranks = first_gold_ranks([p.passage_id for p in stored.passages], gold or set())
    passages = []
    for passage in stored.passages:
        judgment = stored.judgments.get(passage.rank)
        passages.append(
            PassageView(
                id=passage.passage_id,
                rank=passage.rank,
                grade=judgment.grade if judgment else None,
                relevant=judgment.relevant if judgment else None,
                in_top_k=passage.rank <= event.k,
                gold=None if gold is None else passage.rank in gold_ranks,
            )
        )
    measures: dict[str, float | None] = {}
    if score is not None:
        measures = {name: getattr(score, name) for name in MEASURE_NAMES}
        measures["alpha"] = score.alpha
    return EventView(
        event_id=event.event_id,
        status=event.status,
        timestamp=event.timestamp,
        received_at=event.received_at,
        app=event.app,
        retriever=event.retriever,
        environment=event.environment or None,
        query=event.query,
        k=event.k,
        judge=score.judge if score else None,
        prompt_version=score.prompt_version if score else None,
        context_rating=stored.run.context_rating if stored.run else None,
        passages=passages,
        measures=measures,
        gold_passage_ids=event.gold_passage_ids,
        response_grade=event.response_grade,
        answer_correct=event.answer_correct,
        failure_reason=event.failure_reason,
        texts_kept=event.texts_kept,
    )
