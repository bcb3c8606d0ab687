"""Accepting events: validate against the limits, commit, count, then enqueue judging.

The order is the guarantee: nothing is acknowledged before it is committed, and nothing is
enqueued before it is committed (a task never looks for an event that is not there yet).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError

from service import repository
from service.aggregates import Delta
from service.db import session_scope
from service.queue import TaskSender
from service.runtime import Runtime
from service.schemas import EventIn, IngestResult, check_limits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rejection:
    event_id: str | None
    reason: str  # a bounded metric label: invalid, limits, conflict
    message: str


def new_event_id() -> str:
    return uuid.uuid4().hex


def validate(raw: dict[str, Any] | EventIn, runtime: Runtime) -> EventIn | Rejection:
    claimed = raw.get("event_id") if isinstance(raw, dict) else raw.event_id
    event_id = claimed if isinstance(claimed, str) else None
    try:
        event = raw if isinstance(raw, EventIn) else EventIn.model_validate(raw)
    except ValidationError as exc:
        return Rejection(event_id, "invalid", _explain(exc))
    problems = check_limits(event, runtime.settings)
    if problems:
        return Rejection(event_id, "limits", "; ".join(problems))
    return event


def _explain(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "body"
        parts.append(f"{where}: {error['msg']}")
    return "; ".join(parts)


class Ingestor:
    def __init__(self, runtime: Runtime, sender: TaskSender) -> None:
        self.runtime = runtime
        self.sender = sender

    def ingest(
        self, tenant: str, events: Sequence[EventIn], rejections: Sequence[Rejection] = ()
    ) -> list[IngestResult]:
        """Commit the valid events, then count and enqueue; results in the order given."""
        named = [(event.event_id or new_event_id(), event) for event in events]
        with session_scope(self.runtime.engine) as session:
            try:
                stored = repository.insert_events(session, tenant, named, repository.utcnow())
                session.commit()
            except IntegrityError:
                # Another request inserted one of these ids between our check and our insert.
                session.rollback()
                stored = repository.insert_events_one_by_one(
                    session, tenant, named, repository.utcnow()
                )

        delta = Delta()
        results: list[IngestResult] = []
        new_pks: list[int] = []
        for (_, event), outcome in zip(named, stored, strict=True):
            labels = {
                "app": event.app,
                "retriever": event.retriever,
                "environment": event.environment or "",
            }
            if outcome.outcome == "accepted":
                assert outcome.pk is not None
                new_pks.append(outcome.pk)
                delta.inc("events_accepted", labels)
                results.append(IngestResult(event_id=outcome.event_id, status="accepted"))
            elif outcome.outcome == "duplicate":
                delta.inc("events_duplicate", labels)
                results.append(IngestResult(event_id=outcome.event_id, status="duplicate"))
            else:
                delta.inc("events_rejected", {"reason": "conflict"})
                results.append(
                    IngestResult(
                        event_id=outcome.event_id,
                        status="rejected",
                        error="event_id already used for a different event",
                    )
                )
        for rejection in rejections:
            delta.inc("events_rejected", {"reason": rejection.reason})
        self.count(delta)
        if new_pks:
            self.sender.send_judge(new_pks)
        return results

    def count(self, delta: Delta) -> None:
        try:
            self.runtime.aggregates.add(delta)
        except Exception:  # counters are rebuilt from the database; never fail an accepted event
            log.warning("could not update ingest counters", exc_info=True)
