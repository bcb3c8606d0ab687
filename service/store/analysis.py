"""The analysis's database queries: events of a time window and what was stored about them.

Read-only. Lists of event keys are sent in chunks so that a window of many events stays within
the bound-parameter limits of SQLite and PostgreSQL.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, col

from service.store import gold as gold_store
from service.store.models import Event, JudgeRun, Judgment, Passage, Score

CHUNK = 900


@dataclass(frozen=True)
class EventWindow:
    """Events received in [since, until), optionally of one app and/or retriever.

    ``tenant``: None reads every tenant's events (operator views such as the judge gauges);
    ``max_events``: keep only the most recent this many (None: all).
    """

    since: datetime
    until: datetime
    app: str | None = None
    retriever: str | None = None
    tenant: str | None = "default"
    max_events: int | None = None

    def conditions(self) -> list[ColumnElement[bool]]:
        conditions = [
            col(Event.received_at) >= self.since,
            col(Event.received_at) < self.until,
        ]
        if self.tenant is not None:
            conditions.append(col(Event.tenant) == self.tenant)
        if self.app is not None:
            conditions.append(col(Event.app) == self.app)
        if self.retriever is not None:
            conditions.append(col(Event.retriever) == self.retriever)
        return conditions


@dataclass(frozen=True)
class AnalysisEvent:
    pk: int
    k: int
    passage_count: int
    candidates: list[dict[str, Any]] | None
    gold_passage_ids: list[str] | None
    response_grade: int | None
    answer_correct: bool | None
    received_at: datetime

    @property
    def has_gold(self) -> bool:
        return bool(self.gold_passage_ids)


@dataclass(frozen=True)
class JudgeCount:
    judge: str
    prompt_version: str
    events: int


@dataclass(frozen=True)
class GoldJudgment:
    event_pk: int
    judge: str
    prompt_version: str
    rank: int
    relevant: bool


def _chunks(keys: Sequence[int]) -> Iterator[list[int]]:
    for start in range(0, len(keys), CHUNK):
        yield list(keys[start : start + CHUNK])


def _event_query(window: EventWindow) -> Select[Any]:
    return (
        select(
            col(Event.id),
            col(Event.k),
            col(Event.passage_count),
            col(Event.candidates),
            col(Event.gold_passage_ids),
            col(Event.response_grade),
            col(Event.answer_correct),
            col(Event.received_at),
        )
        .where(*window.conditions())
        .order_by(col(Event.received_at).desc(), col(Event.id).desc())
    )


def _event(row: Sequence[Any]) -> AnalysisEvent:
    return AnalysisEvent(
        pk=int(row[0]),
        k=int(row[1]),
        passage_count=int(row[2]),
        candidates=row[3] or None,
        gold_passage_ids=row[4],
        response_grade=row[5],
        answer_correct=row[6],
        received_at=row[7],
    )


def with_labels(
    session: Session, window: EventWindow, events: list[AnalysisEvent]
) -> list[AnalysisEvent]:
    """The window's events with the gold people marked after the fact merged in
    (``service.store.gold`` gives the rule): gold sent with an event and gold added later feed
    the same analysis."""
    labels = gold_store.labels_in(session, window.conditions()) if events else {}
    if not labels:
        return events
    out = []
    for event in events:
        mine = labels.get(event.pk)
        if not mine:
            out.append(event)
            continue
        agreed = gold_store.consensus(event.gold_passage_ids, event.answer_correct, mine)
        out.append(
            replace(
                event,
                gold_passage_ids=agreed.gold_passage_ids,
                answer_correct=agreed.answer_correct,
            )
        )
    return out


def events_in_window(session: Session, window: EventWindow) -> tuple[list[AnalysisEvent], bool]:
    """The window's events, most recent first, and whether ``max_events`` cut some off."""
    statement = _event_query(window)
    if window.max_events is not None:
        statement = statement.limit(window.max_events + 1)
    rows = session.execute(statement).all()
    truncated = window.max_events is not None and len(rows) > window.max_events
    if truncated:
        rows = rows[: window.max_events]
    return with_labels(session, window, [_event(row) for row in rows]), truncated


def gold_events_in_window(
    session: Session, window: EventWindow, among: Sequence[int] | None = None
) -> list[AnalysisEvent]:
    """Only the window's events that carry gold ids, sent with them or marked later (at most
    ``max_events``, most recent), and only those of the ``among`` primary keys when given."""
    if among is None:
        return _gold_events(session, window, [])
    return [
        event
        for chunk in _chunks(list(among))
        for event in _gold_events(session, window, [col(Event.id).in_(chunk)])
    ]


def _gold_events(
    session: Session, window: EventWindow, narrower: list[ColumnElement[bool]]
) -> list[AnalysisEvent]:
    # The events sent with gold, and the events somebody labelled, each read by an index that
    # holds only them (``gold``, not the ids themselves: a non-gold event stores the JSON text
    # null there, which no index tells from a list), then merged in the window's order. One
    # query with OR let SQLite read every event of the tenant's window instead.
    sent = _event_query(window).where(col(Event.gold), *narrower).limit(window.max_events)
    labelled = (
        _event_query(window)
        .select_from(gold_store.labelled_events())
        .where(*narrower)
        .limit(window.max_events)
    )
    rows = {int(row[0]): row for row in (*session.execute(sent), *session.execute(labelled))}
    newest = sorted(rows.values(), key=lambda row: (row.received_at, row.id), reverse=True)
    merged = with_labels(session, window, list(map(_event, newest[: window.max_events])))
    return [event for event in merged if event.has_gold]


def gold_tenants_in_window(session: Session, window: EventWindow) -> list[str]:
    """The tenants with gold events in the window (``window.tenant`` is ignored)."""
    conditions = [
        col(Event.received_at) >= window.since,
        col(Event.received_at) < window.until,
        col(Event.gold),
    ]
    rows = session.execute(
        select(col(Event.tenant)).where(*conditions).distinct().order_by(col(Event.tenant))
    )
    return [str(row[0]) for row in rows]


def judges_in_window(session: Session, window: EventWindow) -> list[JudgeCount]:
    """Judges and prompt versions that scored events of the window, the busiest first."""
    rows = session.execute(
        select(col(Score.judge), col(Score.prompt_version), func.count())
        .join(Event, col(Event.id) == col(Score.event_pk))
        .where(*window.conditions())
        .group_by(col(Score.judge), col(Score.prompt_version))
        .order_by(func.count().desc(), col(Score.judge), col(Score.prompt_version))
    ).all()
    return [JudgeCount(str(r[0]), str(r[1]), int(r[2])) for r in rows]


def grades_by_event(
    session: Session, event_pks: Sequence[int], judge: str, prompt_version: str
) -> dict[int, dict[int, int | None]]:
    """Per event, the judge's grade of each rank it labelled (None: the label is missing)."""
    out: dict[int, dict[int, int | None]] = defaultdict(dict)
    for chunk in _chunks(event_pks):
        rows = session.execute(
            select(col(Judgment.event_pk), col(Judgment.rank), col(Judgment.grade)).where(
                col(Judgment.event_pk).in_(chunk),
                col(Judgment.judge) == judge,
                col(Judgment.prompt_version) == prompt_version,
            )
        )
        for event_pk, rank, grade in rows:
            out[int(event_pk)][int(rank)] = None if grade is None else int(grade)
    return dict(out)


def context_ratings(
    session: Session, event_pks: Sequence[int], judge: str, prompt_version: str
) -> dict[int, int | None]:
    out: dict[int, int | None] = {}
    for chunk in _chunks(event_pks):
        rows = session.execute(
            select(col(JudgeRun.event_pk), col(JudgeRun.context_rating)).where(
                col(JudgeRun.event_pk).in_(chunk),
                col(JudgeRun.judge) == judge,
                col(JudgeRun.prompt_version) == prompt_version,
            )
        )
        for event_pk, rating in rows:
            out[int(event_pk)] = None if rating is None else int(rating)
    return out


def passage_ids(session: Session, event_pks: Sequence[int]) -> dict[int, list[str]]:
    """Per event, its passage ids in rank order."""
    out: dict[int, list[str]] = defaultdict(list)
    for chunk in _chunks(event_pks):
        rows = session.execute(
            select(col(Passage.event_pk), col(Passage.passage_id))
            .where(col(Passage.event_pk).in_(chunk))
            .order_by(col(Passage.event_pk), col(Passage.rank))
        )
        for event_pk, passage_id in rows:
            out[int(event_pk)].append(str(passage_id))
    return dict(out)


def queries(session: Session, event_pks: Sequence[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    for chunk in _chunks(event_pks):
        rows = session.execute(
            select(col(Event.id), col(Event.query)).where(col(Event.id).in_(chunk))
        )
        out.update({int(pk): str(query) for pk, query in rows})
    return out


def labelled_judgments(session: Session, event_pks: Sequence[int]) -> list[GoldJudgment]:
    """Every judge's non-missing relevance label on the given events."""
    out: list[GoldJudgment] = []
    for chunk in _chunks(event_pks):
        rows = session.execute(
            select(
                col(Judgment.event_pk),
                col(Judgment.judge),
                col(Judgment.prompt_version),
                col(Judgment.rank),
                col(Judgment.relevant),
            ).where(col(Judgment.event_pk).in_(chunk), col(Judgment.relevant).is_not(None))
        )
        out.extend(
            GoldJudgment(int(pk), str(judge), str(version), int(rank), bool(relevant))
            for pk, judge, version, rank, relevant in rows
        )
    return out
