"""Removing old events whole (``RM_KEEP_EVENTS_DAYS``): the event, its passage references,
grades, judge runs, scores, people's labels and causes, its duplicate key, and each passage text
no kept event still needs.

On PostgreSQL whole days leave by dropping their partitions (``service/store/partitions.py``);
what the day partitions do not hold (the legacy partition while part of it is recent, the
default partition) leaves as on SQLite: in batches of events, row by row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta

from sqlalchemy import Engine, bindparam, select, text
from sqlmodel import Session, col

from service.store.models import Event
from service.store.partitions import (
    EPOCH,
    DroppedDay,
    day_number,
    days_to_drop,
    drop_day,
    existing_days,
    is_partitioned,
)
from service.store.passages import UNNEEDED_TEXTS

log = logging.getLogger(__name__)

# The tables whose rows belong to one event, by its key; the events go last.
OWNED_BY_EVENTS = ("passages", "judgments", "judge_runs", "scores", "gold_labels", "miss_causes")

# The texts these events referred to that no other unreleased reference of their day needs.
_DELETE_TEXTS_ONLY_THEY_NEED = text(
    UNNEEDED_TEXTS.replace("{also}", "AND live.event_pk NOT IN :pks")
).bindparams(bindparam("pks", expanding=True))
_DELETE_KEYS = text(
    "DELETE FROM event_keys WHERE event_pk IN :pks AND (tenant, event_id) IN "
    "(SELECT tenant, event_id FROM events WHERE id IN :pks)"
).bindparams(bindparam("pks", expanding=True))


@dataclass
class Removal:
    """What one run removed."""

    days: list[DroppedDay] = field(default_factory=list)  # dropped whole (PostgreSQL)
    events_row_by_row: int = 0

    @property
    def events(self) -> int:
        return self.events_row_by_row + sum(day.events for day in self.days)


def remove_events_before(engine: Engine, cutoff: datetime, batch: int = 1000) -> Removal:
    """Remove every event received before ``cutoff``, with everything about it.

    On the day layout the cutoff is taken back to its day's start (UTC): an event leaves with
    its whole day, up to a day after ``cutoff`` passed it, rather than the part of a day before
    the cutoff's hour being deleted row by row every time."""
    removal = Removal()
    with engine.connect() as connection:
        partitioned = is_partitioned(connection)
        if partitioned:
            cutoff = datetime.combine(EPOCH + timedelta(days=day_number(cutoff)), time(), UTC)
        days = existing_days(connection) if partitioned else []
        legacy_done = False
        legacy = (
            partitioned
            and connection.execute(
                text("SELECT to_regclass('events_legacy') IS NOT NULL")
            ).scalar_one()
        )
        if legacy:
            # The rows stored before the layout leave as one piece once all of them are old (the
            # newest read off the received index: no pass over the partition every hour).
            newest = connection.execute(
                text("SELECT max(received_at) FROM events_legacy")
            ).scalar_one()
            legacy_done = newest is None or newest < cutoff
    for day in days_to_drop(days, day_number(cutoff)):
        removal.days.append(drop_day(engine, day))
    if legacy_done:
        removal.days.append(drop_day(engine, -1, partition="legacy"))
    while True:
        removed = _remove_batch(engine, cutoff, batch)
        removal.events_row_by_row += removed
        if removed < batch:
            break
    if removal.events:
        log.info(
            "removed events past RM_KEEP_EVENTS_DAYS",
            extra={"events": removal.events, "days_dropped": len(removal.days)},
        )
    return removal


def _remove_batch(engine: Engine, cutoff: datetime, batch: int) -> int:
    with Session(engine) as session:
        pks = [
            row[0]
            for row in session.execute(
                select(col(Event.id)).where(col(Event.received_at) < cutoff).limit(batch)
            )
        ]
        if pks:
            delete_events(session, pks)
            session.commit()
    return len(pks)


def delete_events(session: Session, pks: list[int]) -> None:
    """Delete these events and every row that belongs to them, in the session's transaction."""
    postgres = session.get_bind().dialect.name == "postgresql"
    if postgres:
        # As the text purge: ingest storing one of these texts again waits for the commit.
        session.execute(text("LOCK TABLE passage_texts IN SHARE ROW EXCLUSIVE MODE"))
    session.execute(_DELETE_TEXTS_ONLY_THEY_NEED, {"pks": pks})
    for table in OWNED_BY_EVENTS:
        statement = text(f"DELETE FROM {table} WHERE event_pk IN :pks")  # noqa: S608
        session.execute(statement.bindparams(bindparam("pks", expanding=True)), {"pks": pks})
    if postgres and is_partitioned(session.connection()):
        session.execute(_DELETE_KEYS, {"pks": pks})
    session.execute(
        text("DELETE FROM events WHERE id IN :pks").bindparams(bindparam("pks", expanding=True)),
        {"pks": pks},
    )
