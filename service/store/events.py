"""The events aggregate: an event with its ranked passages and feedback. Ingest writes it,
the sweeper requeues it, the API reads it back, the rebuild counts it."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

import orjson
import psycopg
from sqlalchemy import func, select, text, update
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError
from sqlmodel import Session, col

from service.contract.schemas import EventIn, FeedbackIn
from service.contract.storable import text_problem
from service.primitives.clock import as_utc
from service.primitives.hashing import text_hash
from service.store.dialect import dialect_of
from service.store.event_rows import NewPassage, insert_new_events
from service.store.lookups import lookup_each, unnest_keys
from service.store.models import (
    Event,
    EventStatus,
    JudgeRun,
    Judgment,
    Score,
)
from service.store.partitions import EVENT_KEYS
from service.store.passages import StoredPassage, read_passages, store_passages


def payload_hash(event: EventIn) -> str:
    """Identity of an event's content, to tell a resend from a different event reusing an id.

    SHA-256 of the event's JSON with sorted keys, as orjson writes it: json.dumps of the same
    body cost 3/4 of this function (its ensure_ascii escaping of 9 KB in Python). Events stored
    before this form carry ``legacy_payload_hash``; ``same_payload`` accepts either.
    """
    body = event.model_dump(mode="json", exclude={"event_id"}, exclude_none=True)
    return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()


def legacy_payload_hash(event: EventIn) -> str:
    """The identity hash events were stored with before ``payload_hash`` used orjson."""
    body = event.model_dump(mode="json", exclude={"event_id"}, exclude_none=True)
    return text_hash(json.dumps(body, sort_keys=True, separators=(",", ":")))


def same_payload(stored_hash: str, digest: str, event: EventIn) -> bool:
    """Whether ``event`` (whose ``payload_hash`` is ``digest``) is the one stored under
    ``stored_hash``, whichever form that hash has: a resend stays a duplicate across the change.
    The legacy form is computed only on a mismatch, so only a resend or a conflict pays for it."""
    return stored_hash == digest or stored_hash == legacy_payload_hash(event)


def passage_key(passage_id: str | None, content_hash: str) -> str:
    # Passages without an app id get a stable id from their content.
    return passage_id if passage_id is not None else f"sha256:{content_hash[:16]}"


IngestOutcome = Literal["accepted", "duplicate", "conflict", "refused"]


@dataclass(frozen=True)
class InsertResult:
    event_id: str
    outcome: IngestOutcome
    pk: int | None
    refusal: str | None = None  # why the database refused the event (outcome "refused")


# Errors a statement raises without reaching the database: a value the driver cannot send.
_UNSENDABLE: tuple[type[Exception], ...] = (ValueError, TypeError, OverflowError, RecursionError)
_REFUSED = (DataError, psycopg.DataError, sqlite3.DataError, *_UNSENDABLE)


def refused_by_store(exc: BaseException) -> bool:
    """The database or its driver refused a value of the event itself: retrying cannot help,
    and the event's own request (or batch slot) should be told so.

    The bodies are checked to be storable before this point (``service/contract/storable.py``); this
    is the safety net for whatever that check misses, so a miss costs one event a 422, never a
    batch or a 503. The passages go to the driver directly (COPY), whose errors are not wrapped.
    """
    if isinstance(exc, _REFUSED):
        return True
    if isinstance(exc, StatementError) and not isinstance(exc, DBAPIError):
        return isinstance(exc.orig, _UNSENDABLE)  # raised while SQLAlchemy bound the values
    return False


def refusal_message(exc: BaseException) -> str:
    # The first line only: the rest of a driver message quotes the statement and its values.
    cause = exc.orig if isinstance(exc, StatementError) and exc.orig is not None else exc
    first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
    return f"the database refused the event: {first[:200]}"


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
        "gold": event.gold_passage_ids is not None,
        "response": event.response,
        "response_grade": event.response_grade,
        "answer_correct": event.answer_correct,
        "event_metadata": event.metadata,
        "status": EventStatus.PENDING.value,
        "enqueued_at": now,
    }


def _new_passages(event_id: str, event: EventIn, hashes: Sequence[str] = ()) -> list[NewPassage]:
    # ``hashes``: the content hashes of the first passages, made by the caller already; the
    # rest are made here.
    hashes = [*hashes, *(text_hash(p.text) for p in event.passages[len(hashes) :])]
    rows = []
    for rank, (passage, digest) in enumerate(zip(event.passages, hashes, strict=True), start=1):
        passage_id = passage_key(passage.id, digest)
        rows.append((event_id, rank, passage_id, passage.score, digest, passage.text))
    return rows


@dataclass(frozen=True)
class InitialState:
    """How an event starts out when ingest already knows: skipped (with why) or judged first."""

    skip_reason: str | None = None  # stored as skipped, never judged
    priority: int = 0  # 1: judged before the others and never shed
    # False: a narrow row, without the event's texts (RM_KEEP_TEXTS=needed); only for an event
    # stored skipped, as nothing will judge it.
    keep_texts: bool = True


_PENDING = InitialState()


def insert_events(
    session: Session,
    tenant: str,
    events: Sequence[tuple[str, EventIn]],
    now: datetime,
    initial: Mapping[str, InitialState] | None = None,
    content_hashes: Mapping[str, Sequence[str]] | None = None,
) -> list[InsertResult]:
    """Store new events in one transaction; known ids come back as duplicate or conflict.

    A fixed number of round trips whatever the batch size: the events in one statement that
    skips the ids already stored, with their passages' references and new texts on PostgreSQL
    (``service/store/event_rows.py``), the stored hashes of the ids skipped when there are
    any, and on SQLite the passages in two statements (``service/store/passages.py``). An id
    repeated in ``events`` is stored once, as its first occurrence. ``initial`` gives an event's
    status and priority at insert (by event id; pending and normal priority when absent);
    ``content_hashes`` the ``text_hash`` of its first passages (any number of them, all of them
    or none), when the caller made them already.

    The caller commits.
    """
    digests: dict[str, str] = {}  # each id's first occurrence in this call
    rows: list[dict[str, Any]] = []
    passages: list[NewPassage] = []
    ordered: list[tuple[str, EventIn, str]] = []
    for event_id, event in events:
        digest = payload_hash(event)
        ordered.append((event_id, event, digest))
        if event_id in digests:
            continue
        digests[event_id] = digest
        row = _new_row(tenant, event_id, event, now, digest, initial)
        rows.append(row)
        if row["texts_kept"]:
            hashes = content_hashes.get(event_id, ()) if content_hashes else ()
            passages.extend(_new_passages(event_id, event, hashes))
    pks, passages_written = insert_new_events(session, tenant, rows, passages)
    # Ids that did not come back were stored before (or by a transaction that committed while
    # this one waited): their hashes tell a resend from a different event.
    known = [event_id for event_id in digests if event_id not in pks]
    stored_hashes = known_payload_hashes(session, tenant, known) if known else {}
    missing = [event_id for event_id in known if event_id not in stored_hashes]
    if missing:  # skipped for a row that was deleted since: not stored, so not acknowledged
        raise IntegrityError("INSERT ... ON CONFLICT DO NOTHING", missing, LookupError(missing))
    if not passages_written:
        store_passages(
            session,
            tenant,
            [(pks[p[0]], *p[1:]) for p in passages if p[0] in pks],
        )
    results: list[InsertResult] = []
    counted: set[str] = set()
    for event_id, event, digest in ordered:
        if event_id in pks and event_id not in counted:
            counted.add(event_id)
            results.append(InsertResult(event_id, "accepted", pks[event_id]))
            continue
        reference = stored_hashes.get(event_id) or digests[event_id]
        same = same_payload(reference, digest, event)
        results.append(InsertResult(event_id, "duplicate" if same else "conflict", None))
    return results


def _new_row(
    tenant: str,
    event_id: str,
    event: EventIn,
    now: datetime,
    digest: str,
    initial: Mapping[str, InitialState] | None,
) -> dict[str, Any]:
    state = initial.get(event_id, _PENDING) if initial else _PENDING
    row = _column_names(_event_row(tenant, event_id, event, now))
    row["payload_hash"] = digest
    if state.skip_reason is not None:
        row["status"] = EventStatus.SKIPPED.value
    row["skip_reason"] = None if state.skip_reason is None else state.skip_reason[:32]
    row["priority"] = state.priority
    row["texts_kept"] = state.keep_texts or state.skip_reason is None
    if not row["texts_kept"]:
        row.update(_NARROW)
    return row


# What a narrow row leaves out: every text of the event. Its identity (the payload hash of the
# whole body, so a resend is still a duplicate and a changed body a conflict), time, labels,
# counts, in-body feedback and status stay, and so does every count made at ingest.
_NARROW = {
    "query": "",
    "candidates": None,
    "response": None,
    "metadata": None,
}


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
    content_hashes: Mapping[str, Sequence[str]] | None = None,
) -> list[InsertResult]:
    """Slow path after a unique-key race or a refused value: each event in its own
    transaction, so one event the database refuses is that event's outcome alone."""
    results: list[InsertResult] = []
    for item in events:
        try:
            try:
                outcome = insert_events(session, tenant, [item], now, initial, content_hashes)
                session.commit()
            except IntegrityError:
                session.rollback()
                outcome = insert_events(session, tenant, [item], now, initial, content_hashes)
                session.commit()
        except Exception as exc:
            if not refused_by_store(exc):
                raise
            session.rollback()
            outcome = [InsertResult(item[0], "refused", None, refusal_message(exc))]
        results.extend(outcome)
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


def _read_pending_by_plain_index_scan(session: Session) -> None:
    """On PostgreSQL, make this transaction's pending counts a plain index scan.

    Each judged event leaves a dead entry under "pending" in the status index until a VACUUM
    removes it. A plain index scan marks the dead entries it meets, and later scans skip them; a
    bitmap scan, which the planner prefers for a count, never does. So without autovacuum the
    count a scrape and the backlog check make would read every event judged since the last
    VACUUM, every time (4.4 ms at 200,000, growing), instead of about once (then 0.1 ms)."""
    if dialect_of(session) == "postgresql":
        session.execute(text("SET LOCAL enable_bitmapscan = off"))


def pending_summary(session: Session) -> PendingSummary:
    _read_pending_by_plain_index_scan(session)
    count, oldest = session.execute(
        select(func.count(), func.min(col(Event.received_at))).where(
            col(Event.status) == EventStatus.PENDING.value
        )
    ).one()
    return PendingSummary(int(count), as_utc(oldest))


def pending_by_tenant(session: Session) -> dict[str, PendingSummary]:
    """``pending_summary`` of each tenant that has pending events."""
    _read_pending_by_plain_index_scan(session)
    rows = session.execute(
        select(col(Event.tenant), func.count(), func.min(col(Event.received_at)))
        .where(col(Event.status) == EventStatus.PENDING.value)
        .group_by(col(Event.tenant))
    ).all()
    return {tenant: PendingSummary(int(count), as_utc(oldest)) for tenant, count, oldest in rows}


def find_event(session: Session, tenant: str, event_id: str) -> Event | None:
    # An id no store can hold names no stored event (PostgreSQL would refuse the lookup itself).
    if text_problem(event_id) is not None:
        return None
    statement = select(Event)
    if dialect_of(session) == "postgresql":
        # The events, partitioned by day, have no index on (tenant, event_id): the duplicate
        # check's key names the event (``service/store/partitions.py``). Between the deletion
        # of a removed day's keys and its drop, a resend is a new event: the key names it.
        statement = statement.join(EVENT_KEYS, EVENT_KEYS.c.event_pk == col(Event.id)).where(
            EVENT_KEYS.c.tenant == tenant, EVENT_KEYS.c.event_id == event_id
        )
    else:
        statement = statement.where(col(Event.tenant) == tenant, col(Event.event_id) == event_id)
    return session.execute(statement).scalar_one_or_none()


def record_feedback(session: Session, event: Event, feedback: FeedbackIn) -> None:
    """Store the feedback on the event; a narrow row takes the grade and correctness, not the
    response's text (it keeps no text), and the feedback is counted the same either way."""
    values = feedback.model_dump(exclude_none=True)
    if not event.texts_kept:
        values.pop("response", None)
    if not values:
        return
    session.execute(update(Event).where(col(Event.id) == event.id).values(**values))


def known_payload_hashes(session: Session, tenant: str, event_ids: Sequence[str]) -> dict[str, str]:
    """The stored payload hash of each of ``event_ids`` the tenant already sent."""
    if not event_ids:
        return {}
    statement: Any
    if session.get_bind().dialect.name == "postgresql":
        # Through the duplicate check's own table (day partitions:
        # ``service/store/partitions.py``): its primary key names the event's key, whose
        # partition's primary key then gives the hash, whichever day holds the event.
        wanted = unnest_keys(event_id=list(dict.fromkeys(event_ids)))
        statement = lookup_each(
            wanted,
            select(col(Event.payload_hash))
            .select_from(EVENT_KEYS.join(Event, col(Event.id) == EVENT_KEYS.c.event_pk))
            .where(EVENT_KEYS.c.tenant == tenant, EVENT_KEYS.c.event_id == wanted.c.event_id),
        )
    else:
        statement = select(col(Event.event_id), col(Event.payload_hash)).where(
            col(Event.tenant) == tenant, col(Event.event_id).in_(list(event_ids))
        )
    return {event_id: digest for event_id, digest in session.execute(statement)}


@dataclass(frozen=True)
class StoredEvent:
    event: Event
    passages: list[StoredPassage]
    judgments: dict[int, Judgment]  # by rank, for the judge of the score shown
    run: JudgeRun | None
    score: Score | None


def stored_event(session: Session, event: Event) -> StoredEvent:
    passages = read_passages(session, [event.id]).get(event.id, []) if event.id else []
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


def accepted_counts(
    session: Session, received_before: datetime
) -> list[tuple[str, str, str, str, int]]:
    """(tenant, app, retriever, environment, events) of every label set."""
    labels = (col(Event.tenant), col(Event.app), col(Event.retriever), col(Event.environment))
    rows = session.execute(
        select(*labels, func.count())
        .where(col(Event.received_at) < received_before)
        .group_by(*labels)
    )
    return [(r[0], r[1], r[2], r[3], int(r[4])) for r in rows]
