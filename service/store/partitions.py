"""Day partitions on PostgreSQL: the tables that grow with events split by the day an event was
stored, so old days leave in one statement per table instead of a row at a time.

The day is carried in the event's key itself: an event stored on day ``d`` (days since
1970-01-01, UTC) has ``id = d << DAY_SHIFT | n`` with ``n`` from the events' sequence. Every table
keyed by the event (passage references, judgments, judge runs, scores) is partitioned on the
same ranges of ``event_pk``, so a day's rows of all five tables lie in partitions of the same
name suffix and no child table needs a column of its own for the day. Keys stay below 2**53
(until the year 2329), so a JavaScript client reads them exactly.

What else the layout holds (migration 0012):
- ``<table>_legacy``: every row stored before the layout, under the keys it had (all below
  ``1 << DAY_SHIFT``), attached as it was; it leaves as one piece once all of it is past
  ``RM_KEEP_EVENTS_DAYS``.
- ``<table>_default``: rows of a day whose partition does not exist (the scheduler did not run
  ahead in time). Nothing is refused for want of a partition; such rows leave by the row-wise
  delete, and that day's partition cannot be created while they are there.
- ``event_keys``: the duplicate check. ``UNIQUE (tenant, event_id)`` cannot hold across
  partitions (a unique index on a partitioned table must contain the partition key), so ingest
  inserts each event's (tenant, event_id) into this unpartitioned table first, ``ON CONFLICT DO
  NOTHING``, and stores only the events whose key went in: a resend a day later meets the key
  of the first send whichever partition holds it, and names its key: reading the first send's
  payload hash (to tell a resend from a conflict) or the event itself by its id is a probe of
  this key, then of one partition's primary key. The events carry no index of their own on
  (tenant, event_id).

SQLite has none of this: its events keep the unique constraint and old events leave in batches.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from sqlalchemy import BigInteger as BigInt
from sqlalchemy import Column, MetaData, String, Table, text
from sqlalchemy.engine import Connection, Engine

log = logging.getLogger(__name__)

DAYS_AHEAD = 3  # days whose partitions exist before their first event
DAY_SHIFT = 36  # 2**36 events a day (about 795,000 a second) before the day bits are reached
KEY_MASK = (1 << DAY_SHIFT) - 1
EPOCH = date(1970, 1, 1)

# Each partitioned table and the column its ranges are on: an event key, or (the passage texts)
# the day itself. Events come last: a day's other rows go first, so nothing refers to an event
# that is gone.
PARTITIONED: tuple[tuple[str, str], ...] = (
    ("passage_texts", "day"),
    ("passages", "event_pk"),
    ("judgments", "event_pk"),
    ("judge_runs", "event_pk"),
    ("scores", "event_pk"),
    ("events", "id"),
)
# Small tables that refer to events without being partitioned: a person's labels and causes.
REFERRING: tuple[str, ...] = ("gold_labels", "miss_causes")

# Tables of the PostgreSQL layout that no model describes (SQLite has no use for them).
POSTGRES_ONLY = MetaData()
EVENT_KEYS = Table(
    "event_keys",
    POSTGRES_ONLY,
    Column("tenant", String(100), primary_key=True),
    Column("event_id", String(200), primary_key=True),
    Column("event_pk", BigInt(), nullable=False),
)

_DAY_NAME = re.compile(r"_d(\d{8})$")


def day_number(moment: datetime) -> int:
    """Days since 1970-01-01 of a moment, in UTC."""
    return (moment.astimezone(UTC).date() - EPOCH).days


def day_of_key(event_pk: int) -> int:
    return event_pk >> DAY_SHIFT


def day_bounds(day: int) -> tuple[int, int]:
    """The keys of a day's events: from the first (included) to the next day's first."""
    return day << DAY_SHIFT, (day + 1) << DAY_SHIFT


def bounds_of(column: str, day: int) -> tuple[int, int]:
    """A day's range in a partitioned table's column: of event keys, or of days."""
    return (day, day + 1) if column == "day" else day_bounds(day)


def partition_name(table: str, day: int) -> str:
    return f"{table}_d{(EPOCH + timedelta(days=day)):%Y%m%d}"


def is_partitioned(connection: Connection) -> bool:
    """Whether this database has the day layout (PostgreSQL at migration 0012 or later)."""
    if connection.dialect.name != "postgresql":
        return False
    found = connection.execute(
        text("SELECT relkind FROM pg_class WHERE relname = 'events' AND relkind = 'p'")
    ).first()
    return found is not None


def existing_days(connection: Connection) -> list[int]:
    """The days that have a partition of events, oldest first."""
    rows = connection.execute(
        text(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = 'events'::regclass"
        )
    )
    days = []
    for (name,) in rows:
        match = _DAY_NAME.search(name)
        if match:
            days.append((datetime.strptime(match.group(1), "%Y%m%d").date() - EPOCH).days)
    return sorted(days)


def create_day(connection: Connection, day: int) -> bool:
    """Create day ``day``'s partition of every partitioned table (those missing); False when
    the default partitions already hold rows of that day, which keeps them there."""
    # Creating a partition locks its table against ingest while it waits: briefly, and retried
    # the next hour (the days are made three ahead).
    connection.execute(text("SET LOCAL lock_timeout = '1s'"))
    try:
        with connection.begin_nested():
            for table, column in PARTITIONED:
                low, high = bounds_of(column, day)
                # Constants and integers only: the names come from PARTITIONED.
                connection.execute(
                    text(
                        f"CREATE TABLE IF NOT EXISTS {partition_name(table, day)} "
                        f"PARTITION OF {table} FOR VALUES FROM ({low}) TO ({high})"
                    )
                )
    except Exception as exc:  # the default partition holds that day, or a lock timed out
        log.warning(
            "could not create the partitions of a day",
            extra={
                "day": partition_name("events", day),
                "error": (str(exc).splitlines() or [type(exc).__name__])[0],
            },
        )
        return False
    return True


def ensure_days_ahead(engine: Engine, today: int, ahead: int) -> list[int]:
    """Create the partitions of today and the ``ahead`` days after it that are missing; the
    days created."""
    with engine.connect() as connection:
        if not is_partitioned(connection):
            return []
        have = set(existing_days(connection))
        connection.commit()
        created = []
        for day in range(today, today + ahead + 1):
            if day in have:
                continue
            with connection.begin():
                if create_day(connection, day):
                    created.append(day)
        return created


@dataclass(frozen=True)
class DroppedDay:
    day: int  # -1: the legacy partition
    # The day's events, counted by their duplicate keys deleted (one each): the one row-wise step.
    events: int
    seconds_keys: float
    seconds_drop: float  # the labels' range and the DROP statements, in one transaction


def drop_day(engine: Engine, day: int, partition: str | None = None) -> DroppedDay:
    """Remove a day (or the legacy partition, ``partition="legacy"``) from every table.

    Two transactions, each complete alone, so a crash between them leaves a state the next run
    finishes:
    1. the day's duplicate keys are deleted, driven by the day's own events (a primary-key
       probe each; the one step whose work grows with the day): from then on a resend of one
       of them is a new event, stored today;
    2. the rows of people's labels and causes for the day (a range of their event key, on its
       index), then each table's partition: a ``DROP TABLE`` each, the events' after ``DETACH``
       (labels refer to them). The day's passage texts are its own (each day stores the texts
       its events refer to), so they leave with it, and a kept day keeps its copy.
    """
    suffix = partition or partition_name("", day)[1:]
    names = {table: f"{table}_{suffix}" for table, _ in PARTITIONED}
    events_part = names["events"]
    low, high = (None, 1 << DAY_SHIFT) if partition == "legacy" else day_bounds(day)
    in_range = f"event_pk < {high}" if low is None else f"event_pk >= {low} AND event_pk < {high}"
    with engine.connect() as connection:
        started = time.perf_counter()
        with connection.begin():
            exists = connection.execute(
                text("SELECT to_regclass(:name) IS NOT NULL"), {"name": events_part}
            ).scalar_one()
            if not exists:
                return DroppedDay(day, 0, 0.0, 0.0)
            keys = connection.execute(
                text(
                    f"DELETE FROM event_keys k USING {events_part} e "  # noqa: S608
                    "WHERE k.tenant = e.tenant AND k.event_id = e.event_id AND k.event_pk = e.id"
                )
            ).rowcount
        keys_done = time.perf_counter()
        with connection.begin():
            connection.execute(text("SET LOCAL lock_timeout = '30s'"))
            for table in REFERRING:
                connection.execute(text(f"DELETE FROM {table} WHERE {in_range}"))  # noqa: S608
            for table, _column in PARTITIONED:
                if table == "events":
                    connection.execute(text(f"ALTER TABLE events DETACH PARTITION {events_part}"))
                connection.execute(text(f"DROP TABLE IF EXISTS {names[table]}"))
        finished = time.perf_counter()
    return DroppedDay(day, int(keys or 0), keys_done - started, finished - keys_done)


def days_to_drop(existing: Sequence[int], before_day: int) -> list[int]:
    """The days wholly before ``before_day`` (the first day still kept)."""
    return [day for day in existing if day < before_day]


def schema_tables(dialect: str) -> list[Table]:
    """Every table a database of ``dialect`` holds, the models' and the layout's own (not the
    partitions, which are reached through their tables), parents before the tables that refer
    to them."""
    from sqlmodel import SQLModel

    tables = list(SQLModel.metadata.sorted_tables)
    if dialect == "postgresql":
        tables.extend(POSTGRES_ONLY.sorted_tables)
    return tables
