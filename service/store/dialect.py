"""Small dialect-aware SQL helpers every repository shares: which database a session talks to,
the one insert-or-update and insert-or-ignore of each dialect, JSON list columns read as rows,
and moments as epoch seconds and time buckets. SQLite and PostgreSQL are the two dialects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import (
    JSON,
    Float,
    Integer,
    Table,
    Text,
    bindparam,
    case,
    cast,
    func,
    literal,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session

from service.store.models import table


def dialect_of(session: Session) -> str:
    return session.get_bind().dialect.name


def dialect_insert(session: Session, model: type[Any]) -> Any:
    """The INSERT of the session's dialect, the one that can say what a conflict does."""
    dialect = dialect_of(session)
    if dialect == "postgresql":
        return postgresql.insert(table(model))
    if dialect == "sqlite":
        return sqlite.insert(table(model))
    raise RuntimeError(f"unsupported database dialect {dialect}")  # pragma: no cover


def upsert(
    session: Session, model: type[Any], values: Mapping[str, Any], key: Sequence[str]
) -> None:
    """Insert ``values`` as a row of ``model``, or, when a row with the same ``key`` columns is
    there, replace its other columns with them."""
    replaced = {name: value for name, value in values.items() if name not in key}
    session.execute(
        dialect_insert(session, model)
        .values(dict(values))
        .on_conflict_do_update(index_elements=list(key), set_=replaced)
    )


def insert_ignore(session: Session, model: type[Any], rows: list[dict[str, Any]]) -> None:
    """Insert ``rows`` of ``model``, leaving out each that conflicts with a row already there."""
    insert_rows(session, model, rows, ignore_conflicts=True)


def insert_rows(
    session: Session,
    model: type[Any],
    rows: list[dict[str, Any]],
    *,
    ignore_conflicts: bool = False,
) -> None:
    """Insert ``rows`` of ``model`` (dicts with the same keys, of scalar columns: an array of
    JSON values is not a type to unnest), in one statement on PostgreSQL.

    There an executemany is one INSERT per row on the server (pipelined, but each parsed,
    planned and answered on its own, and each answer handled in Python), so the rows go instead
    as one array per column, unnested: one statement whatever their number, whose text does not
    change with it. SQLite runs in this process, where an executemany costs no round trip."""
    if not rows:
        return
    if dialect_of(session) == "postgresql":
        session.execute(
            _unnested_insert(table(model), tuple(rows[0]), ignore_conflicts), _arrays(rows)
        )
        return
    statement = dialect_insert(session, model)
    session.execute(statement.on_conflict_do_nothing() if ignore_conflicts else statement, rows)


@lru_cache(maxsize=64)
def _unnested_insert(target: Table, columns: tuple[str, ...], ignore_conflicts: bool) -> Any:
    """``INSERT INTO t (a, b) SELECT * FROM unnest(CAST(:a AS a_type[]), ...)``, built once per
    table and column list (its compiled form is then cached by SQLAlchemy)."""
    arrays = [
        cast(
            bindparam(name, type_=postgresql.ARRAY(target.c[name].type)),
            postgresql.ARRAY(target.c[name].type),
        )
        for name in columns
    ]
    given = func.unnest(*arrays).table_valued(*columns).render_derived(name="given")
    statement = postgresql.insert(target).from_select(
        list(columns), select(*(given.c[name] for name in columns))
    )
    return statement.on_conflict_do_nothing() if ignore_conflicts else statement


def _arrays(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    return {name: [row[name] for row in rows] for name in rows[0]}


# --- JSON list columns ----------------------------------------------------------------------------

# Escapes that PostgreSQL cannot turn into text (json_array_elements_text fails the whole query
# on them): a NUL, a high surrogate without its low half, a low one without its high half. A row
# stored before the storable check may hold them; they are read as U+FFFD, like every other read
# (service.store.readable). A valid pair is kept.
PG_UNTEXTABLE_ESCAPES = (
    r"\\u0000",
    r"\\u[dD][89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F][0-9a-fA-F]{2})",
    r"(?<!\\u[dD][89abAB][0-9a-fA-F]{2})\\u[dD][c-fC-F][0-9a-fA-F]{2}",
)
PG_SUSPECT_ESCAPE = r"\\u(0000|[dD][89a-fA-F])"


def pg_textable(document: Any) -> Any:
    """A JSON column whose strings PostgreSQL can extract as text, whatever an old row holds."""
    as_text: Any = cast(document, Text)
    cleaned = as_text
    for pattern in PG_UNTEXTABLE_ESCAPES:
        cleaned = func.regexp_replace(cleaned, pattern, r"\\ufffd", "g")
    # The regular expressions run only on the rare document that holds a suspect escape.
    return case((as_text.op("~")(PG_SUSPECT_ESCAPE), cast(cleaned, JSON)), else_=document)


def json_length_above_zero(dialect: str, document: Any) -> ColumnElement[bool]:
    if dialect == "postgresql":
        # An absent list is stored as JSON null, and json_array_length() rejects a scalar.
        length = case(
            (func.json_typeof(document) == "array", func.json_array_length(document)), else_=0
        )
        return length > 0
    return func.coalesce(func.json_array_length(document), 0) > 0


def json_strings(dialect: str, document: Any, name: str, *, checked: bool = False) -> Any:
    """The strings of a JSON list column, as a table with one ``value`` column. ``checked``: a
    list column every row of which was written through the storable check (the labels', whose
    table is newer than the check), which needs no cleaning of old escapes."""
    if dialect == "postgresql":
        if checked:
            return func.json_array_elements_text(document).table_valued("value").alias(name)
        safe = case(
            (func.json_typeof(document) == "array", pg_textable(document)),
            else_=cast(literal("[]"), JSON),
        )
        return func.json_array_elements_text(safe).table_valued("value").alias(name)
    return func.json_each(document).table_valued("value").alias(name)


# --- moments --------------------------------------------------------------------------------------


def epoch_seconds(dialect: str, moment: Any) -> ColumnElement[float]:
    if dialect == "postgresql":
        return cast(func.extract("epoch", moment), Float)
    # julianday() reads the stored ISO text; 2440587.5 is the Julian day of 1970-01-01.
    return (func.julianday(moment) - 2440587.5) * 86400.0


def bucket_index(dialect: str, moment: Any, start: datetime, width: int) -> ColumnElement[int]:
    offset = (epoch_seconds(dialect, moment) - start.timestamp()) / width
    # The offset is never negative here, where truncation and floor agree; PostgreSQL's cast
    # rounds, so it needs floor() (which older SQLite builds lack).
    if dialect == "postgresql":
        return cast(func.floor(offset), Integer)
    return cast(offset, Integer)
