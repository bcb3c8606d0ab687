"""Writing event rows: new ones inserted, known ids left alone, in one statement per commit group.

``INSERT ... ON CONFLICT (tenant, event_id) DO NOTHING RETURNING id, event_id`` both stores the
new events and tells which ids were already there (those do not come back), so ingest needs no
lookup of known ids before it: the lookup and the INSERT were two round trips and the larger
part of a lone event's storing. A concurrent insert of the same id waits for the other
transaction and is then skipped, where a plain INSERT raised a unique-key error.

The rows go to the driver as tuples. SQLAlchemy's per-row work on an insert (a dictionary of
parameters each, checked and processed one key at a time) cost more than the database's own;
each value is still converted by its column type's own bind processor, as SQLAlchemy converts it
(UTC datetimes, JSON text), so what is stored is what an ORM insert stores
(``tests/integration/test_event_rows.py`` compares the two, column by column, on both stores).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy.engine import Dialect
from sqlmodel import Session

from service.store.models import Event, table

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
    "response",
    "response_grade",
    "answer_correct",
    "metadata",
    "status",
    "enqueued_at",
    "skip_reason",
    "priority",
)

# SQLite takes at most 32,766 parameters in a statement: 21 columns x 500 rows stay below it.
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


@lru_cache(maxsize=4)
def _postgres_statement(dialect: Dialect) -> str:
    """The INSERT with the casts SQLAlchemy's psycopg dialect writes for each column (JSON,
    timestamptz, a VARCHAR without its length: a cast to the length would cut a longer value
    where the column refuses it), so the server types each value as an ORM insert has it."""
    statement = table(Event).insert().values(dict.fromkeys(COLUMNS))
    compiled = str(statement.compile(dialect=dialect))
    casts = dict(re.findall(r"%\((\w+)\)s((?:::[A-Z ]+)?)", compiled))
    placeholders = ", ".join(f"%s{casts[name]}" for name in COLUMNS)
    # Built from constants only: the column names above and SQLAlchemy's type names.
    return (
        f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES ({placeholders}) "  # noqa: S608
        "ON CONFLICT (tenant, event_id) DO NOTHING RETURNING id, event_id"
    )


def _sqlite_statement(rows: int) -> str:
    one = "(" + ", ".join("?" * len(COLUMNS)) + ")"
    return (
        f"INSERT INTO events ({', '.join(COLUMNS)}) VALUES {', '.join([one] * rows)} "  # noqa: S608
        "ON CONFLICT (tenant, event_id) DO NOTHING RETURNING id, event_id"
    )


def insert_new_events(session: Session, rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Insert the rows (by column name, ``COLUMNS`` at least) whose (tenant, event_id) is not
    stored yet, in the session's transaction; the key of each row inserted, by event id.

    All rows must be of one tenant and have distinct event ids."""
    if not rows:
        return {}
    connection = session.connection()
    dialect = connection.dialect
    processors = _processors(dialect)
    values = []
    for row in rows:
        value = [row[name] for name in COLUMNS]
        for position, processor in processors:
            value[position] = processor(value[position])
        values.append(value)
    driver: Any = connection.connection.driver_connection
    inserted: dict[str, int] = {}
    if dialect.name == "postgresql":
        with driver.cursor() as cursor:
            # Pipelined by psycopg: one round trip, and the statement is prepared once.
            cursor.executemany(_postgres_statement(dialect), values, returning=True)
            while True:
                for key, event_id in cursor.fetchall():
                    inserted[event_id] = key
                if not cursor.nextset():
                    break
        return inserted
    cursor = driver.cursor()
    try:
        for start in range(0, len(values), _SQLITE_ROWS_PER_STATEMENT):
            chunk = values[start : start + _SQLITE_ROWS_PER_STATEMENT]
            flat = [item for value in chunk for item in value]
            for key, event_id in cursor.execute(_sqlite_statement(len(chunk)), flat):
                inserted[event_id] = key
    finally:
        cursor.close()
    return inserted
