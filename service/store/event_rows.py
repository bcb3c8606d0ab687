"""Writing event rows: new ones inserted, known ids left alone, in one statement per commit group.

``INSERT ... ON CONFLICT (tenant, event_id) DO NOTHING RETURNING id, event_id`` both stores the
new events and tells which ids were already there (those do not come back; on PostgreSQL the
conflict is met in ``event_keys``, the duplicate check of the day-partitioned events), so
ingest needs no lookup of known ids before it: the lookup and the INSERT were two round trips
and the larger part of a lone event's storing. A concurrent insert of the same id waits for the
other transaction and is then skipped, where a plain INSERT raised a unique-key error.

The rows go to the driver as tuples. SQLAlchemy's per-row work on an insert (a dictionary of
parameters each, checked and processed one key at a time) cost more than the database's own;
each value is still converted by its column type's own bind processor, as SQLAlchemy converts it
(UTC datetimes, JSON text), so what is stored is what an ORM insert stores
(``tests/integration/store/test_event_rows.py`` compares the two, column by column, on both stores).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy.engine import Dialect
from sqlmodel import Session

from service.store.binary_arrays import (
    BOOL_OID,
    INT8_OID,
    TEXT_OID,
    TIMESTAMPTZ_OID,
    arrays_usable,
    column_array,
)
from service.store.driver import driver_errors
from service.store.models import Event, table
from service.store.partitions import DAY_SHIFT, KEY_MASK, day_number
from service.store.passages import POSTGRES_PASSAGES_WITH, postgres_passage_parameters

# The columns ingest writes, in the order of every tuple; the others keep their defaults.
COLUMNS = (
    "tenant",
    "event_id",
    "payload_hash",
    "timestamp",
    "received_at",
    "app",
    "retriever",
    "environment",
    "query",
    "k",
    "passage_count",
    "candidates",
    "gold_passage_ids",
    "gold",
    "response",
    "response_grade",
    "answer_correct",
    "metadata",
    "status",
    "enqueued_at",
    "skip_reason",
    "priority",
    "texts_kept",
)

# SQLite takes at most 32,766 parameters in a statement: 23 columns x 500 rows stay below it.
_SQLITE_ROWS_PER_STATEMENT = 500

Processor = Callable[[Any], Any]


@lru_cache(maxsize=4)
def _processors(dialect: Dialect) -> tuple[tuple[int, Processor], ...]:
    """(column position, bind processor) of each written column whose type converts values."""
    columns = table(Event).c
    found = []
    for position, name in enumerate(COLUMNS):
        processor = columns[name].type._cached_bind_processor(dialect)
        if processor is not None:
            found.append((position, processor))
    return tuple(found)


# The element type each column's values are sent as on PostgreSQL, one array per column.
_POSTGRES_ARRAYS = {
    "VARCHAR": "varchar[]",
    "TEXT": "text[]",
    "INTEGER": "integer[]",
    "BOOLEAN": "boolean[]",
    "TIMESTAMP WITH TIME ZONE": "timestamptz[]",
    "JSON": "text[]",  # JSON text, cast per value below
}


@lru_cache(maxsize=4)
def _postgres_columns(dialect: Dialect) -> tuple[str, ...]:
    """Each written column's type name as SQLAlchemy's psycopg dialect has it."""
    columns = table(Event).c
    return tuple(
        re.sub(r"\(.*\)", "", columns[name].type.compile(dialect=dialect)) for name in COLUMNS
    )


@lru_cache(maxsize=4)
def _postgres_statement_with_passages(dialect: Dialect) -> str:
    """One statement for any number of rows: each column's values as one array, unnested.

    Its text does not change with the number of rows, so the server parses and plans it once
    per connection; an executemany of one INSERT per row cost about 4x its client CPU (psycopg
    handles each row's result in Python).

    The events are day-partitioned (``service/store/partitions.py``), which rules out a unique
    constraint on (tenant, event_id): each event's key goes first into ``event_keys``, skipping
    those already there, and only the events whose key went in are inserted, under the key made
    there (the day given, then the events' sequence). Then the passages' data-modifying WITH
    queries (``service/store/passages.py``) follow ``new_events``: a lone event is two round
    trips (BEGIN, this statement)."""
    kinds = _postgres_columns(dialect)
    arrays = ", ".join(f"%b::{_POSTGRES_ARRAYS[kind]}" for kind in kinds)
    # JSON goes as text and is cast on the server, as SQLAlchemy sends it (JSON, not JSONB).
    picked = ", ".join(
        f"given.{name}::json" if kind == "JSON" else f"given.{name}"
        for name, kind in zip(COLUMNS, kinds, strict=True)
    )
    # Built from constants only: the column names above, the type names of the table and the
    # key layout's integers.
    return (
        f"WITH given AS (SELECT * FROM unnest({arrays}) AS given({', '.join(COLUMNS)})), "  # noqa: S608
        "new_keys AS ("
        "INSERT INTO event_keys (tenant, event_id, event_pk) "
        f"SELECT tenant, event_id, (%b::bigint << {DAY_SHIFT}) | "
        f"(nextval('events_id_seq') & {KEY_MASK}) FROM given "
        "ON CONFLICT DO NOTHING RETURNING event_id, event_pk), "
        f"new_events AS (INSERT INTO events (id, {', '.join(COLUMNS)}) "
        f"SELECT new_keys.event_pk, {picked} FROM given "
        "JOIN new_keys ON new_keys.event_id = given.event_id RETURNING id, event_id), "
        f"{POSTGRES_PASSAGES_WITH} "
        "SELECT id, event_id FROM new_events"
    )


# The element type each column's array is encoded with (``binary_arrays``); the statement
# casts it to the column's own type, as it cast the arrays psycopg made.
_ELEMENT_OIDS = {
    "VARCHAR": TEXT_OID,
    "TEXT": TEXT_OID,
    "INTEGER": INT8_OID,
    "BOOLEAN": BOOL_OID,
    "TIMESTAMP WITH TIME ZONE": TIMESTAMPTZ_OID,
    "JSON": TEXT_OID,
}


def _postgres_values(
    dialect: Dialect, rows: Sequence[Mapping[str, Any]], encode: bool = True
) -> list[Any]:
    """One array per column. JSON values are written as SQLAlchemy writes them (json.dumps; a
    Python None is the JSON null, not SQL NULL, as the columns do not set none_as_null).
    ``encode``: each array already in the binary form (``binary_arrays``), else as a list."""
    processors = dict(_processors(dialect))
    arrays: list[Any] = []
    for position, (name, kind) in enumerate(zip(COLUMNS, _postgres_columns(dialect), strict=True)):
        values = [row[name] for row in rows]
        if kind == "JSON":
            values = [json.dumps(value) for value in values]
        elif position in processors:
            convert = processors[position]
            values = [convert(value) for value in values]
        arrays.append(column_array(values, _ELEMENT_OIDS[kind], encode))
    return arrays


def _sqlite_statement(rows: int) -> str:
    one = "(" + ", ".join("?" * len(COLUMNS)) + ")"
    return (
        f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES {', '.join([one] * rows)} "  # noqa: S608
        "ON CONFLICT (tenant, event_id) DO NOTHING RETURNING id, event_id"
    )


# (event id, rank, passage id, score, content hash, text): a passage of an event to insert.
NewPassage = tuple[str, int, str, float | None, str, str]


def insert_new_events(
    session: Session,
    tenant: str,
    rows: Sequence[Mapping[str, Any]],
    passages: Sequence[NewPassage] = (),
) -> tuple[dict[str, int], bool]:
    """Insert the rows (by column name, ``COLUMNS`` at least) whose (tenant, event_id) is not
    stored yet, in the session's transaction; the key of each row inserted, by event id, and
    whether ``passages`` were written with them.

    On PostgreSQL the passages of the events inserted (and their texts not stored yet) go in the
    same statement, one round trip for all three tables; on SQLite, which runs in the process
    and has no round trips to save, the caller writes them (``store_passages``). All rows must
    be of ``tenant`` and have distinct event ids."""
    if not rows:
        return {}, True
    connection = session.connection()
    dialect = connection.dialect
    driver: Any = connection.connection.driver_connection
    inserted: dict[str, int] = {}
    if dialect.name == "postgresql":
        statement = _postgres_statement_with_passages(dialect)
        day = day_number(rows[0]["received_at"])
        encode = arrays_usable(driver)
        parameters = [
            *_postgres_values(dialect, rows, encode),
            day,
            *postgres_passage_parameters(tenant, day, passages, encode),
        ]
        with driver_errors(connection, statement), driver.cursor() as cursor:
            cursor.execute(statement, parameters)
            for key, event_id in cursor.fetchall():
                inserted[event_id] = key
        return inserted, True
    processors = _processors(dialect)
    values = []
    for row in rows:
        value = [row[name] for name in COLUMNS]
        for position, processor in processors:
            value[position] = processor(value[position])
        values.append(value)
    with driver_errors(connection, _sqlite_statement(1)):
        cursor = driver.cursor()
        try:
            for start in range(0, len(values), _SQLITE_ROWS_PER_STATEMENT):
                chunk = values[start : start + _SQLITE_ROWS_PER_STATEMENT]
                flat = [item for value in chunk for item in value]
                for key, event_id in cursor.execute(_sqlite_statement(len(chunk)), flat):
                    inserted[event_id] = key
        finally:
            cursor.close()
    return inserted, False
