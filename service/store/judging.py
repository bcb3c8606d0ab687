"""The judging aggregate: what the judge said of an event (judgments, judge runs, the label
cache) and the scores computed from it; also the purge of judged texts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, select, tuple_, update
from sqlmodel import Session, col

from service.measures.catalogue import MEASURE_NAMES
from service.primitives.clock import as_utc, utcnow
from service.store.dialect import insert_ignore, insert_rows
from service.store.lookups import lookup_each, unnest_keys
from service.store.models import (
    Event,
    EventStatus,
    JudgeRun,
    Judgment,
    LabelCache,
    Score,
)
from service.store.passages import read_passages, release_texts


@dataclass(frozen=True)
class PassageForJudging:
    rank: int
    passage_id: str
    text: str
    content_hash: str


@dataclass(frozen=True)
class EventForJudging:
    pk: int
    event_id: str
    tenant: str
    app: str
    retriever: str
    environment: str
    query: str
    k: int
    status: str
    received_at: datetime
    gold_passage_ids: list[str] | None
    passages: list[PassageForJudging]  # top k and the window up to 2k, in rank order


def load_for_judging(session: Session, event_pk: int) -> EventForJudging | None:
    found = load_many_for_judging(session, [event_pk])
    return found[0] if found else None


def load_many_for_judging(session: Session, event_pks: Sequence[int]) -> list[EventForJudging]:
    """``load_for_judging`` for many events in two queries; unknown pks are left out, and so
    are narrow rows (``RM_KEEP_TEXTS``), which hold nothing to judge."""
    if not event_pks:
        return []
    # Columns rather than ORM objects: a slice loads many events, and only reads them.
    events = session.execute(
        select(
            col(Event.id),
            col(Event.event_id),
            col(Event.tenant),
            col(Event.app),
            col(Event.retriever),
            col(Event.environment),
            col(Event.query),
            col(Event.k),
            col(Event.status),
            col(Event.received_at),
            col(Event.gold_passage_ids),
        ).where(col(Event.id).in_(list(event_pks)), col(Event.texts_kept))
    ).all()
    by_pk = {event.id: event for event in events}
    if not by_pk:
        return []
    stored = read_passages(session, list(by_pk), judged_window_only=True)
    passages = {
        pk: [
            PassageForJudging(p.rank, p.passage_id, p.text, p.content_hash)
            for p in stored.get(pk, [])
        ]
        for pk in by_pk
    }
    # In the order asked for: the first of two events needing the same label pays for it.
    ordered = [pk for pk in dict.fromkeys(event_pks) if pk in by_pk]
    return [
        EventForJudging(
            pk=pk,
            event_id=event.event_id,
            tenant=event.tenant,
            app=event.app,
            retriever=event.retriever,
            environment=event.environment,
            query=event.query,
            k=event.k,
            status=event.status,
            received_at=as_utc(event.received_at) or utcnow(),
            gold_passage_ids=event.gold_passage_ids,
            passages=passages[pk],
        )
        for pk in ordered
        for event in (by_pk[pk],)
    ]


@dataclass(frozen=True)
class JudgeIdentity:
    judge: str
    model: str
    prompt_version: str


def cached_labels_many(
    session: Session, who: JudgeIdentity, wanted: dict[tuple[str, str], set[str]]
) -> dict[tuple[str, str, str], int]:
    """Cached grades for many queries at once: ``wanted`` maps a (tenant scope, query hash) to
    passage hashes, the answer (scope, query hash, passage hash) to grades. A scope is a tenant
    (or SHARED_SCOPE, ``models.derived_scope``): a grade is never read under another one.

    Only the pairs asked for are read. PostgreSQL looks each pair up on the primary key from a
    list of values (``lookup_each``), a plan that holds whatever the planner's statistics say;
    SQLite reads the pairs with a row-value IN on the same key.
    """
    pairs = sorted(
        (scope, query_hash, passage)
        for (scope, query_hash), hashes in wanted.items()
        for passage in hashes
    )
    if not pairs:
        return {}
    same_judge = (
        col(LabelCache.judge) == who.judge,
        col(LabelCache.model) == who.model,
        col(LabelCache.prompt_version) == who.prompt_version,
    )
    statement: Any
    if session.get_bind().dialect.name == "postgresql":
        wanted_pairs = unnest_keys(
            tenant=[scope for scope, _, _ in pairs],
            query_hash=[query_hash for _, query_hash, _ in pairs],
            passage_hash=[passage for _, _, passage in pairs],
        )
        statement = lookup_each(
            wanted_pairs,
            select(col(LabelCache.grade)).where(
                col(LabelCache.tenant) == wanted_pairs.c.tenant,
                *same_judge,
                col(LabelCache.query_hash) == wanted_pairs.c.query_hash,
                col(LabelCache.passage_hash) == wanted_pairs.c.passage_hash,
            ),
        )
    else:
        statement = select(
            col(LabelCache.tenant),
            col(LabelCache.query_hash),
            col(LabelCache.passage_hash),
            col(LabelCache.grade),
        ).where(
            *same_judge,
            tuple_(
                col(LabelCache.tenant), col(LabelCache.query_hash), col(LabelCache.passage_hash)
            ).in_(pairs),
        )
    return {
        (scope, query_hash, passage_hash): int(grade)
        for scope, query_hash, passage_hash, grade in session.execute(statement)
    }


def scored_event_pks(session: Session, event_pks: Sequence[int], who: JudgeIdentity) -> set[int]:
    """The events among ``event_pks`` that already have a score under this judge and version."""
    if not event_pks:
        return set()
    rows = session.execute(
        select(col(Score.event_pk)).where(
            col(Score.event_pk).in_(list(event_pks)),
            col(Score.judge) == who.judge,
            col(Score.prompt_version) == who.prompt_version,
        )
    )
    return {int(row[0]) for row in rows}


@dataclass(frozen=True)
class JudgingResult:
    grades: Sequence[int | None]  # per passage in rank order, as in EventForJudging.passages
    from_cache: Sequence[bool]
    context_rating: int | None
    calls: int
    prompt_tokens: int
    completion_tokens: int
    malformed_replies: int
    new_cache_entries: dict[str, int]  # passage hash (or ctx: key) -> grade
    query_hash: str
    measures: dict[str, float | None]
    np_window: int
    alpha: float
    threshold: int
    # Per passage, the local judge's cosine when it was computed now (None: an LLM judge, a
    # cached label, a passage not sent).
    similarities: Sequence[float | None] | None = None
    # The tenant its new label-cache rows are kept under (``models.derived_scope``).
    derived_scope: str = ""


@dataclass(frozen=True)
class StoredScore:
    """An event's score under one judge and prompt version, with the run that produced it, as
    column values (the scores and judge_runs rows)."""

    score: Mapping[str, Any]
    run: Mapping[str, Any] | None


def _of_event_by(
    model: type[Score] | type[JudgeRun], event_pk: int, who: JudgeIdentity
) -> tuple[ColumnElement[bool], ...]:
    """The conditions that pick an event's row written by one judge and prompt version."""
    return (
        col(model.event_pk) == event_pk,
        col(model.judge) == who.judge,
        col(model.prompt_version) == who.prompt_version,
    )


def stored_score(session: Session, event_pk: int, who: JudgeIdentity) -> StoredScore:
    score = session.execute(select(Score).where(*_of_event_by(Score, event_pk, who))).scalar_one()
    run = session.execute(
        select(JudgeRun).where(*_of_event_by(JudgeRun, event_pk, who))
    ).scalar_one_or_none()
    return StoredScore(score.model_dump(), run.model_dump() if run is not None else None)


@dataclass(frozen=True)
class _JudgingRows:
    judgments: list[dict[str, Any]]
    run: dict[str, Any]
    cache: list[dict[str, Any]]
    score: dict[str, Any]


# Rows are built as plain dicts: a slice writes hundreds of them, and constructing ORM objects
# (attribute instrumentation on every field) cost more than the inserts themselves.
_SCORE_MEASURES = frozenset(MEASURE_NAMES)


def _judging_rows(
    event: EventForJudging, who: JudgeIdentity, result: JudgingResult, now: datetime
) -> _JudgingRows:
    similarities = result.similarities or [None] * len(event.passages)
    judgments = [
        {
            "event_pk": event.pk,
            "rank": passage.rank,
            "judge": who.judge,
            "model": who.model,
            "prompt_version": who.prompt_version,
            "grade": grade,
            "relevant": None if grade is None else grade >= result.threshold,
            "from_cache": cached,
            "similarity": similarity,
            "created_at": now,
        }
        for passage, grade, cached, similarity in zip(
            event.passages, result.grades, result.from_cache, similarities, strict=True
        )
    ]
    run = {
        "event_pk": event.pk,
        "judge": who.judge,
        "model": who.model,
        "prompt_version": who.prompt_version,
        "context_rating": result.context_rating,
        "calls": result.calls,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "cache_hits": sum(result.from_cache),
        "missing_labels": sum(g is None for g in result.grades),
        "malformed_replies": result.malformed_replies,
        "created_at": now,
    }
    cache = [
        {
            "tenant": result.derived_scope,
            "judge": who.judge,
            "model": who.model,
            "prompt_version": who.prompt_version,
            "query_hash": result.query_hash,
            "passage_hash": passage_hash,
            "grade": grade,
            "created_at": now,
        }
        for passage_hash, grade in result.new_cache_entries.items()
    ]
    score: dict[str, Any] = dict.fromkeys(_SCORE_MEASURES)
    score.update(
        (name, None if value is None else float(value))
        for name, value in result.measures.items()
        if name in _SCORE_MEASURES
    )
    score.update(
        event_pk=event.pk,
        judge=who.judge,
        prompt_version=who.prompt_version,
        alpha=result.alpha,
        np_window=result.np_window,
        created_at=now,
    )
    return _JudgingRows(judgments, run, cache, score)


def store_judging(
    session: Session, event: EventForJudging, who: JudgeIdentity, result: JudgingResult
) -> StoredScore | None:
    """Write judgments, the run, new cache entries and the score, and mark the event judged.

    One transaction (the caller commits); None when the score already existed (a redelivered
    task), in which case nothing is written. What it wrote comes back, so exporting it needs no
    second read.
    """
    return store_judging_many(session, who, [(event, result)]).get(event.pk)


def store_judging_many(
    session: Session,
    who: JudgeIdentity,
    judged: Sequence[tuple[EventForJudging, JudgingResult]],
) -> dict[int, StoredScore]:
    """``store_judging`` for many events with one statement per table (the caller commits).

    Events that already have a score are left out of the writes and of the answer. A concurrent
    writer of the same score makes the commit fail on the unique keys instead; the caller rolls
    back and stores one event at a time.
    """
    scored = scored_event_pks(session, [event.pk for event, _ in judged], who)
    now = utcnow()
    rows = {
        event.pk: _judging_rows(event, who, result, now)
        for event, result in judged
        if event.pk not in scored
    }
    if not rows:
        return {}
    insert_rows(session, Judgment, [row for r in rows.values() for row in r.judgments])
    insert_rows(session, JudgeRun, [r.run for r in rows.values()])
    # One row per pair even if two results carry it (a statement may not hit its own conflict).
    cache = {
        (row["tenant"], row["query_hash"], row["passage_hash"]): row
        for r in rows.values()
        for row in r.cache
    }
    insert_ignore(session, LabelCache, list(cache.values()))
    insert_rows(session, Score, [r.score for r in rows.values()])
    session.execute(
        update(Event)
        .where(col(Event.id).in_(list(rows)))
        .values(status=EventStatus.JUDGED.value, judged_at=now, failure_reason=None)
    )
    return {pk: StoredScore(r.score, r.run) for pk, r in rows.items()}


def erase_passage_texts(session: Session, event_pks: Sequence[int]) -> None:
    """Keep only the content hashes of events' passages (hash_after_judging storage): the
    events read empty texts, and a text no unjudged or retained event needs is deleted."""
    release_texts(session, event_pks)


def purge_texts(session: Session, received_before: datetime, limit: int) -> int:
    """Erase the texts of judged or failed events received before a moment; scores stay.

    A passage text shared with an event still within retention (or still pending) stays for
    that event; the purged events read it as empty.
    """
    pks = [
        row[0]
        for row in session.execute(
            select(col(Event.id))
            .where(
                col(Event.received_at) < received_before,
                col(Event.status) != EventStatus.PENDING.value,
                col(Event.query) != "",
            )
            .limit(limit)
        )
    ]
    if pks:
        session.execute(update(Event).where(col(Event.id).in_(pks)).values(query="", response=None))
        release_texts(session, pks)
    return len(pks)


def mark_failed(session: Session, event_pk: int, reason: str) -> None:
    session.execute(
        update(Event)
        .where(col(Event.id) == event_pk, col(Event.status) == EventStatus.PENDING.value)
        .values(status=EventStatus.FAILED.value, failure_reason=reason[:500])
    )


@dataclass(frozen=True)
class ScoredEvent:
    event_pk: int
    tenant: str
    app: str
    retriever: str
    environment: str
    judged_passages: int
    score: Score
    run: JudgeRun | None


def scored_events(session: Session, after_score_id: int, limit: int) -> list[ScoredEvent]:
    """Scores in id order with their event's labels and judge run, one page at a time."""
    rows = session.execute(
        select(
            Score,
            col(Event.app),
            col(Event.retriever),
            col(Event.environment),
            col(Event.k),
            col(Event.passage_count),
            JudgeRun,
            col(Event.tenant),
        )
        .join(Event, col(Event.id) == col(Score.event_pk))
        .outerjoin(
            JudgeRun,
            (col(JudgeRun.event_pk) == col(Score.event_pk))
            & (col(JudgeRun.judge) == col(Score.judge))
            & (col(JudgeRun.prompt_version) == col(Score.prompt_version)),
        )
        .where(col(Score.id) > after_score_id)
        .order_by(col(Score.id))
        .limit(limit)
    ).all()
    return [
        ScoredEvent(
            event_pk=row[0].event_pk,
            tenant=row[7],
            app=row[1],
            retriever=row[2],
            environment=row[3],
            judged_passages=min(row[5], 2 * row[4]),
            score=row[0],
            run=row[6],
        )
        for row in rows
    ]
