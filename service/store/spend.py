"""The queries of judge spend control: marking events skipped, and shedding a backlog."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, func, not_, select, update
from sqlmodel import Session, col

from service.store.models import Event, EventStatus, Score


def mark_skipped(session: Session, event_pks: Sequence[int], reason: str) -> list[int]:
    """Skip the events still pending; the ones that were, in order."""
    if not event_pks:
        return []
    pending = [
        row[0]
        for row in session.execute(
            select(col(Event.id)).where(
                col(Event.id).in_(event_pks), col(Event.status) == EventStatus.PENDING.value
            )
        )
    ]
    if pending:
        session.execute(
            update(Event)
            .where(col(Event.id).in_(pending), col(Event.status) == EventStatus.PENDING.value)
            .values(status=EventStatus.SKIPPED.value, skip_reason=reason[:32])
        )
    return pending


@dataclass(frozen=True)
class Shed:
    pk: int
    tenant: str
    app: str
    retriever: str
    environment: str


def sheddable_backlog(session: Session, keep: int, limit: int) -> list[Shed]:
    """Per tenant, its oldest pending normal-priority events beyond its newest ``keep`` pending
    ones; at most ``limit`` in all.

    The bound is each tenant's own, so one tenant's flood sheds its own backlog and never another
    tenant's events. Gold and urgent events (priority 1) are never shed and do not count against
    ``keep``.
    """
    normal = (col(Event.status) == EventStatus.PENDING.value, col(Event.priority) == 0)
    backlogs = session.execute(
        select(col(Event.tenant), func.count()).where(*normal).group_by(col(Event.tenant))
    ).all()
    victims: list[Shed] = []
    for tenant, pending in sorted(backlogs):
        excess = min(int(pending) - keep, limit - len(victims))
        if excess <= 0:
            continue
        rows = session.execute(
            select(
                col(Event.id),
                col(Event.tenant),
                col(Event.app),
                col(Event.retriever),
                col(Event.environment),
            )
            .where(*normal, col(Event.tenant) == tenant)
            .order_by(col(Event.received_at), col(Event.id))
            .limit(excess)
        )
        victims += [Shed(*row) for row in rows]
    return victims


@dataclass(frozen=True)
class RejudgeSelection:
    since: datetime
    until: datetime
    tenant: str
    app: str | None
    retriever: str | None
    include_skipped: bool
    after_pk: int
    without_judge: str | None  # leave out events that already have a score from this judge


def rejudge_candidates(session: Session, selection: RejudgeSelection) -> list[tuple[int, str]]:
    """(event pk, app) of the events to judge again, in pk order (the resume cursor's order)."""
    statuses = [EventStatus.JUDGED.value, EventStatus.FAILED.value]
    if selection.include_skipped:
        statuses.append(EventStatus.SKIPPED.value)
    query = select(col(Event.id), col(Event.app)).where(
        *_window(selection),
        col(Event.status).in_(statuses),
        col(Event.id) > selection.after_pk,
        # A narrow row has nothing to judge: no query, no passages.
        col(Event.texts_kept),
    )
    if selection.without_judge is not None:
        scored = select(col(Score.event_pk)).where(col(Score.judge) == selection.without_judge)
        query = query.where(col(Event.id).not_in(scored))
    return [(row[0], row[1]) for row in session.execute(query.order_by(col(Event.id)))]


def _window(selection: RejudgeSelection) -> list[ColumnElement[bool]]:
    conditions = [
        col(Event.tenant) == selection.tenant,
        col(Event.received_at) >= selection.since,
        col(Event.received_at) < selection.until,
    ]
    if selection.app is not None:
        conditions.append(col(Event.app) == selection.app)
    if selection.retriever is not None:
        conditions.append(col(Event.retriever) == selection.retriever)
    return conditions


def narrow_events(session: Session, selection: RejudgeSelection) -> int:
    """Events of the selection's window stored narrow (RM_KEEP_TEXTS=needed): never judged, and
    without the texts a re-judge would need."""
    return int(
        session.execute(
            select(func.count()).where(*_window(selection), not_(col(Event.texts_kept)))
        ).scalar_one()
    )
