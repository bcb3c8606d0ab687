"""Every database query of the project. Routes and tasks call these; none writes SQL itself."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from sqlalchemy import Select, String, bindparam, func, select, true, tuple_, update
from sqlalchemy import text as sql_text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.selectable import TableValuedAlias
from sqlmodel import Session, col

from service.models import (
    Event,
    EventStatus,
    JudgeRun,
    Judgment,
    LabelCache,
    Passage,
    Score,
    table,
)
from service.schemas import EventIn, FeedbackIn


def utcnow() -> datetime:
    return datetime.now(UTC)


def text_hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def payload_hash(event: EventIn) -> str:
    """Identity of an event's content, to tell a resend from a different event reusing an id."""
    body = event.model_dump(mode="json", exclude={"event_id"}, exclude_none=True)
    return text_hash(json.dumps(body, sort_keys=True, separators=(",", ":")))


def passage_key(passage_id: str | None, content_hash: str) -> str:
    # Passages without an app id get a stable id from their content.
    return passage_id if passage_id is not None else f"sha256:{content_hash[:16]}"


# --- ingest -------------------------------------------------------------------------------------

IngestOutcome = Literal["accepted", "duplicate", "conflict"]


@dataclass(frozen=True)
class InsertResult:
    event_id: str
    outcome: IngestOutcome
    pk: int | None


def _event_row(tenant: str, event_id: str, event: EventIn, now: datetime) -> dict[str, Any]:
    return {
        "tenant": tenant,
        "event_id": event_id,
        "timestamp": event.timestamp or now,
        "received_at": now,
        "app": event.app,
        "retriever": event.retriever,
        "environment": event.environment or "",
        "query": event.query,
        "k": event.effective_k,
        "passage_count": len(event.passages),
        "candidates": (
            [c.model_dump(mode="json") for c in event.candidates] if event.candidates else None
        ),
        "gold_passage_ids": event.gold_passage_ids,
        "response": event.response,
        "response_grade": event.response_grade,
        "answer_correct": event.answer_correct,
        "event_metadata": event.metadata,
        "status": EventStatus.PENDING.value,
        "enqueued_at": now,
    }


# The passage columns in the order of the tuples ``_passage_rows`` builds.
_PASSAGES_COPY = "COPY passages (event_pk, rank, passage_id, text, score, content_hash) FROM STDIN"
_PASSAGES_INSERT = (
    "INSERT INTO passages (event_pk, rank, passage_id, text, score, content_hash) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)


def _passage_rows(event_pk: int, event: EventIn) -> list[tuple[Any, ...]]:
    rows = []
    for rank, passage in enumerate(event.passages, start=1):
        digest = text_hash(passage.text)
        rows.append(
            (event_pk, rank, passage_key(passage.id, digest), passage.text, passage.score, digest)
        )
    return rows


@dataclass(frozen=True)
class InitialState:
    """How an event starts out when ingest already knows: skipped (with why) or judged first."""

    skip_reason: str | None = None  # stored as skipped, never judged
    priority: int = 0  # 1: judged before the others and never shed


_PENDING = InitialState()


def insert_events(
    session: Session,
    tenant: str,
    events: Sequence[tuple[str, EventIn]],
    now: datetime,
    initial: Mapping[str, InitialState] | None = None,
) -> list[InsertResult]:
    """Store new events in one transaction; known ids come back as duplicate or conflict.

    A fixed number of round trips whatever the batch size: one lookup of the known ids, the
    events in one statement (see ``_insert_event_rows``), and the passages in one bulk write
    (``COPY`` on PostgreSQL, a prepared ``executemany`` on SQLite). ``initial`` gives an
    event's status and priority at insert (by event id; pending and normal priority when
    absent).

    The caller commits. A concurrent insert of the same id surfaces as IntegrityError at insert
    or commit time; ``insert_events_one_by_one`` resolves that case.
    """
    existing = known_payload_hashes(session, tenant, [event_id for event_id, _ in events])
    outcomes: list[tuple[str, IngestOutcome]] = []
    new_rows: list[dict[str, Any]] = []
    new_events: list[EventIn] = []
    seen_in_batch: dict[str, str] = {}
    for event_id, event in events:
        digest = payload_hash(event)
        known_hash = existing.get(event_id) or seen_in_batch.get(event_id)
        if known_hash is not None:
            outcomes.append((event_id, "duplicate" if known_hash == digest else "conflict"))
            continue
        state = initial.get(event_id, _PENDING) if initial else _PENDING
        row = _column_names(_event_row(tenant, event_id, event, now))
        row["payload_hash"] = digest
        if state.skip_reason is not None:
            row["status"] = EventStatus.SKIPPED.value
        row["skip_reason"] = None if state.skip_reason is None else state.skip_reason[:32]
        row["priority"] = state.priority
        seen_in_batch[event_id] = digest
        new_rows.append(row)
        new_events.append(event)
        outcomes.append((event_id, "accepted"))
    pks: dict[str, int] = {}
    if new_rows:
        pks = _insert_event_rows(session, new_rows)
        passage_rows = [
            passage
            for row, event in zip(new_rows, new_events, strict=True)
            for passage in _passage_rows(pks[row["event_id"]], event)
        ]
        _bulk_insert_passages(session, passage_rows)
    return [
        InsertResult(event_id, outcome, pks.get(event_id) if outcome == "accepted" else None)
        for event_id, outcome in outcomes
    ]


def _insert_event_rows(session: Session, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Insert event rows in one round trip; their keys by event id."""
    events_table = table(Event)
    if session.get_bind().dialect.name == "postgresql":
        # Keys from the sequence first, then a plain executemany (psycopg pipelines it). A
        # multi-row INSERT ... RETURNING is one statement too, but psycopg re-parses its ~2,000
        # placeholders on every batch (it caches only short statements): twice the CPU.
        keys = session.execute(_NEXT_EVENT_IDS, {"n": len(rows)}).scalars().all()
        for row, key in zip(rows, keys, strict=True):
            row["id"] = key
        session.execute(events_table.insert(), rows)
        return {row["event_id"]: row["id"] for row in rows}
    # SQLite: one multi-row INSERT ... RETURNING (SQLAlchemy's insertmanyvalues). Keys are
    # matched by event id: asking for parameter order makes SQLAlchemy insert row by row.
    inserted = session.execute(
        events_table.insert().returning(events_table.c.id, events_table.c.event_id), rows
    )
    return {event_id: pk for pk, event_id in inserted}


_NEXT_EVENT_IDS = sql_text(
    "SELECT nextval(pg_get_serial_sequence('events', 'id')) FROM generate_series(1, :n)"
)


def _bulk_insert_passages(session: Session, rows: list[tuple[Any, ...]]) -> None:
    """Write passage rows on the session's own connection, inside its transaction.

    Plain tuples straight to the driver: SQLAlchemy's per-row parameter processing was most of
    the cost of this step, and the columns need no conversion (ints, text, a float).
    """
    connection = session.connection()
    driver = connection.connection.driver_connection
    if connection.dialect.name == "postgresql":
        with driver.cursor() as cursor, cursor.copy(_PASSAGES_COPY) as copy:  # type: ignore[union-attr]
            for row in rows:
                copy.write_row(row)
    else:
        cursor = driver.cursor()  # type: ignore[union-attr]
        try:
            cursor.executemany(_PASSAGES_INSERT, rows)
        finally:
            cursor.close()


def _column_names(row: dict[str, Any]) -> dict[str, Any]:
    # The attribute ``event_metadata`` is stored in the column ``metadata``.
    out = dict(row)
    if "event_metadata" in out:
        out["metadata"] = out.pop("event_metadata")
    return out


def insert_events_one_by_one(
    session: Session,
    tenant: str,
    events: Sequence[tuple[str, EventIn]],
    now: datetime,
    initial: Mapping[str, InitialState] | None = None,
) -> list[InsertResult]:
    """Slow path after a unique-key race: each event in its own transaction."""
    results: list[InsertResult] = []
    for item in events:
        try:
            results.extend(insert_events(session, tenant, [item], now, initial))
            session.commit()
        except IntegrityError:
            session.rollback()
            results.extend(insert_events(session, tenant, [item], now, initial))
            session.commit()
    return results


def mark_enqueued(session: Session, event_pks: Sequence[int], now: datetime) -> None:
    if event_pks:
        session.execute(update(Event).where(col(Event.id).in_(event_pks)).values(enqueued_at=now))


def pending_to_requeue(session: Session, stale_before: datetime, limit: int) -> list[int]:
    rows = session.execute(
        select(col(Event.id))
        .where(col(Event.status) == EventStatus.PENDING.value)
        .where((col(Event.enqueued_at).is_(None)) | (col(Event.enqueued_at) < stale_before))
        .order_by(col(Event.received_at))
        .limit(limit)
    )
    return [row[0] for row in rows]


@dataclass(frozen=True)
class PendingSummary:
    count: int
    oldest_received_at: datetime | None


def pending_summary(session: Session) -> PendingSummary:
    count, oldest = session.execute(
        select(func.count(), func.min(col(Event.received_at))).where(
            col(Event.status) == EventStatus.PENDING.value
        )
    ).one()
    return PendingSummary(int(count), _aware(oldest))


def _aware(moment: datetime | None) -> datetime | None:
    # SQLite hands datetimes back naive; they were written as UTC.
    if moment is not None and moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment


def find_event(session: Session, tenant: str, event_id: str) -> Event | None:
    return session.execute(
        select(Event).where(col(Event.tenant) == tenant, col(Event.event_id) == event_id)
    ).scalar_one_or_none()


def record_feedback(session: Session, event: Event, feedback: FeedbackIn) -> None:
    values = feedback.model_dump(exclude_none=True)
    session.execute(update(Event).where(col(Event.id) == event.id).values(**values))


# --- judging ------------------------------------------------------------------------------------


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
    """``load_for_judging`` for many events in two queries; unknown pks are left out."""
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
        ).where(col(Event.id).in_(list(event_pks)))
    ).all()
    by_pk = {event.id: event for event in events}
    if not by_pk:
        return []
    rows = session.execute(
        select(
            col(Passage.event_pk),
            col(Passage.rank),
            col(Passage.passage_id),
            col(Passage.text),
            col(Passage.content_hash),
        )
        .join(Event, col(Event.id) == col(Passage.event_pk))
        # The events' ids on both sides: with them only on passages, PostgreSQL hash-joins a
        # sequential scan of every event for each slice.
        .where(
            col(Passage.event_pk).in_(list(by_pk)),
            col(Event.id).in_(list(by_pk)),
            col(Passage.rank) <= 2 * col(Event.k),
        )
        .order_by(col(Passage.event_pk), col(Passage.rank))
    ).all()
    passages: dict[int, list[PassageForJudging]] = {pk: [] for pk in by_pk}
    for event_pk, *passage in rows:
        passages[event_pk].append(PassageForJudging(*passage))
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
            received_at=_aware(event.received_at) or utcnow(),
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


def known_payload_hashes(session: Session, tenant: str, event_ids: Sequence[str]) -> dict[str, str]:
    """The stored payload hash of each of ``event_ids`` the tenant already sent."""
    if not event_ids:
        return {}
    statement: Any
    if session.get_bind().dialect.name == "postgresql":
        wanted = _unnest(event_id=list(dict.fromkeys(event_ids)))
        statement = _lookup_each(
            wanted,
            select(col(Event.payload_hash)).where(
                col(Event.tenant) == tenant, col(Event.event_id) == wanted.c.event_id
            ),
        )
    else:
        statement = select(col(Event.event_id), col(Event.payload_hash)).where(
            col(Event.tenant) == tenant, col(Event.event_id).in_(list(event_ids))
        )
    return {event_id: digest for event_id, digest in session.execute(statement)}


def cached_labels_many(
    session: Session, who: JudgeIdentity, wanted: dict[str, set[str]]
) -> dict[tuple[str, str], int]:
    """Cached grades for many queries at once: ``wanted`` maps a query hash to passage hashes.

    Only the pairs asked for are read. PostgreSQL looks each pair up on the primary key from a
    list of values (``_lookup_each``), a plan that holds whatever the planner's statistics say;
    SQLite reads the pairs with a row-value IN on the same key.
    """
    pairs = sorted(
        (query_hash, passage) for query_hash, hashes in wanted.items() for passage in hashes
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
        wanted_pairs = _unnest(
            query_hash=[query_hash for query_hash, _ in pairs],
            passage_hash=[passage for _, passage in pairs],
        )
        statement = _lookup_each(
            wanted_pairs,
            select(col(LabelCache.grade)).where(
                *same_judge,
                col(LabelCache.query_hash) == wanted_pairs.c.query_hash,
                col(LabelCache.passage_hash) == wanted_pairs.c.passage_hash,
            ),
        )
    else:
        statement = select(
            col(LabelCache.query_hash), col(LabelCache.passage_hash), col(LabelCache.grade)
        ).where(
            *same_judge,
            tuple_(col(LabelCache.query_hash), col(LabelCache.passage_hash)).in_(pairs),
        )
    return {
        (query_hash, passage_hash): int(grade)
        for query_hash, passage_hash, grade in session.execute(statement)
    }


def _unnest(**columns: list[str]) -> TableValuedAlias:
    """PostgreSQL rows ``wanted(<column>, ...)`` from one array parameter per column.

    Arrays, not a VALUES list: the statement's text stays the same whatever the number of keys,
    so SQLAlchemy compiles it once (a VALUES list of 220 ids was compiled anew on every ingest
    batch: 15 ms of CPU) and PostgreSQL can keep it prepared.
    """
    arrays = [
        bindparam(f"wanted_{name}", value, type_=ARRAY(String)) for name, value in columns.items()
    ]
    return func.unnest(*arrays).table_valued(*columns).render_derived(name="wanted")


def _lookup_each(wanted: TableValuedAlias, row: Select[Any]) -> Select[Any]:
    """``wanted``'s columns beside the one row ``row`` finds for each (missing rows dropped).

    A correlated LATERAL subquery with LIMIT 1 keeps PostgreSQL from flattening the lookup into
    a join: each wanted row becomes one probe of the unique key. Without statistics the planner
    otherwise scans every row of the judge or the tenant for each statement, a cost that grows
    with the table (measured: 455 ms against 1.5 ms for 112 pairs among 100,000 labels).
    """
    found = row.limit(1).lateral("found")
    return select(*wanted.c, *found.c).select_from(wanted).join(found, true())


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


@dataclass(frozen=True)
class StoredScore:
    """An event's score under one judge and prompt version, with the run that produced it, as
    column values (the scores and judge_runs rows)."""

    score: Mapping[str, Any]
    run: Mapping[str, Any] | None


def stored_score(session: Session, event_pk: int, who: JudgeIdentity) -> StoredScore:
    score = session.execute(
        select(Score).where(
            col(Score.event_pk) == event_pk,
            col(Score.judge) == who.judge,
            col(Score.prompt_version) == who.prompt_version,
        )
    ).scalar_one()
    run = session.execute(
        select(JudgeRun).where(
            col(JudgeRun.event_pk) == event_pk,
            col(JudgeRun.judge) == who.judge,
            col(JudgeRun.prompt_version) == who.prompt_version,
        )
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
_SCORE_MEASURES = frozenset(Score.model_fields) - {
    "id",
    "event_pk",
    "judge",
    "prompt_version",
    "alpha",
    "np_window",
    "created_at",
}


def _judging_rows(
    event: EventForJudging, who: JudgeIdentity, result: JudgingResult, now: datetime
) -> _JudgingRows:
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
            "created_at": now,
        }
        for passage, grade, cached in zip(
            event.passages, result.grades, result.from_cache, strict=True
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
    session.execute(table(Judgment).insert(), [row for r in rows.values() for row in r.judgments])
    session.execute(table(JudgeRun).insert(), [r.run for r in rows.values()])
    # One row per pair even if two results carry it (a statement may not hit its own conflict).
    cache = {
        (row["query_hash"], row["passage_hash"]): row for r in rows.values() for row in r.cache
    }
    _insert_ignore(session, LabelCache, list(cache.values()))
    session.execute(table(Score).insert(), [r.score for r in rows.values()])
    session.execute(
        update(Event)
        .where(col(Event.id).in_(list(rows)))
        .values(status=EventStatus.JUDGED.value, judged_at=now, failure_reason=None)
    )
    return {pk: StoredScore(r.score, r.run) for pk, r in rows.items()}


def erase_passage_texts(session: Session, event_pks: Sequence[int]) -> None:
    """Keep only the content hashes of events' passages (hash_after_judging storage)."""
    if event_pks:
        session.execute(
            update(Passage).where(col(Passage.event_pk).in_(list(event_pks))).values(text="")
        )


def purge_texts(session: Session, received_before: datetime, limit: int) -> int:
    """Erase the texts of judged or failed events received before a moment; scores stay."""
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
        session.execute(update(Passage).where(col(Passage.event_pk).in_(pks)).values(text=""))
    return len(pks)


def mark_failed(session: Session, event_pk: int, reason: str) -> None:
    session.execute(
        update(Event)
        .where(col(Event.id) == event_pk, col(Event.status) == EventStatus.PENDING.value)
        .values(status=EventStatus.FAILED.value, failure_reason=reason[:500])
    )


def _insert_ignore(session: Session, model: type[Any], rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    target = table(model)
    dialect = session.get_bind().dialect.name
    statement: Any
    if dialect == "postgresql":
        statement = postgresql.insert(target).on_conflict_do_nothing()
    elif dialect == "sqlite":
        statement = sqlite.insert(target).on_conflict_do_nothing()
    else:  # pragma: no cover - only the two dialects above are supported
        raise RuntimeError(f"unsupported database dialect {dialect}")
    session.execute(statement, rows)


# --- reading an event back ----------------------------------------------------------------------


@dataclass(frozen=True)
class StoredEvent:
    event: Event
    passages: list[Passage]
    judgments: dict[int, Judgment]  # by rank, for the judge of the score shown
    run: JudgeRun | None
    score: Score | None


def stored_event(session: Session, event: Event) -> StoredEvent:
    passages = list(
        session.execute(
            select(Passage).where(col(Passage.event_pk) == event.id).order_by(col(Passage.rank))
        ).scalars()
    )
    score = (
        session.execute(
            select(Score).where(col(Score.event_pk) == event.id).order_by(col(Score.id).desc())
        )
        .scalars()
        .first()
    )
    judgments: dict[int, Judgment] = {}
    run: JudgeRun | None = None
    if score is not None:
        for judgment in session.execute(
            select(Judgment).where(
                col(Judgment.event_pk) == event.id,
                col(Judgment.judge) == score.judge,
                col(Judgment.prompt_version) == score.prompt_version,
            )
        ).scalars():
            judgments[judgment.rank] = judgment
        run = session.execute(
            select(JudgeRun).where(
                col(JudgeRun.event_pk) == event.id,
                col(JudgeRun.judge) == score.judge,
                col(JudgeRun.prompt_version) == score.prompt_version,
            )
        ).scalar_one_or_none()
    return StoredEvent(event, passages, judgments, run, score)


def older_than(now: datetime, seconds: float) -> datetime:
    return now - timedelta(seconds=seconds)


# --- rebuilding the shared aggregates -----------------------------------------------------------


def accepted_counts(session: Session, received_before: datetime) -> list[tuple[str, str, str, int]]:
    rows = session.execute(
        select(col(Event.app), col(Event.retriever), col(Event.environment), func.count())
        .where(col(Event.received_at) < received_before)
        .group_by(col(Event.app), col(Event.retriever), col(Event.environment))
    )
    return [(r[0], r[1], r[2], int(r[3])) for r in rows]


@dataclass(frozen=True)
class ScoredEvent:
    event_pk: int
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
            app=row[1],
            retriever=row[2],
            environment=row[3],
            judged_passages=min(row[5], 2 * row[4]),
            score=row[0],
            run=row[6],
        )
        for row in rows
    ]
