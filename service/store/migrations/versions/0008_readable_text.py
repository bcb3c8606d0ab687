"""readable text: NUL and lone surrogates stored before the storable check become U+FFFD

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 14:00:00.000000

Older versions accepted a NUL or a lone surrogate in any text. PostgreSQL refuses both in text
columns, but its json columns keep them as escapes (``\\u0000``, ``\\ud800``); SQLite keeps the
escapes in its JSON columns and raw bytes (a NUL, or bytes that are not UTF-8) in any text column.
Each such value is rewritten in place with U+FFFD; every row stays, and a value without any is not
written. The engine already reads such values as U+FFFD (``service.store.readable``); this makes
the stored data agree, so that SQL over it (PostgreSQL's JSON functions, exports, other readers)
meets clean text too. Running it again finds nothing to rewrite. The rewrite is not undone.
"""

import json
import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine.interfaces import ReflectedColumn

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

REPLACEMENT = "\ufffd"
BATCH = 1000
# In a Python str every code point of the surrogate range is a lone surrogate.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Kept here rather than imported: a migration must do the same thing whatever the code becomes.
_PG_SUSPECT = r"\\u(0000|[dD][89a-fA-F])"


def _clean_string(value: str) -> str:
    return _UNSTORABLE.sub(REPLACEMENT, value)


def _clean_json(value: Any) -> Any:
    if isinstance(value, str):
        return _clean_string(value)
    if isinstance(value, list):
        return [_clean_json(item) for item in value]
    if isinstance(value, dict):
        return {_clean_string(k): _clean_json(v) for k, v in value.items()}
    return value


def _is_json(column: ReflectedColumn) -> bool:
    return isinstance(column["type"], sa.JSON)


def _is_text(column: ReflectedColumn) -> bool:
    return isinstance(column["type"], sa.String) or _is_json(column)


def _cleaned_json_text(document: str) -> str | None:
    """The document with its strings cleaned, or None when nothing changes (or not JSON)."""
    try:
        value = json.loads(document)
    except ValueError:
        return None
    cleaned = _clean_json(value)
    # json.dumps with its defaults is how the application wrote these columns.
    return json.dumps(cleaned) if cleaned != value else None


def _clean_sqlite_table(
    bind: sa.Connection, table: str, columns: Sequence[ReflectedColumn]
) -> None:
    names = [c["name"] for c in columns if _is_text(c)]
    if not names:
        return
    json_names = {c["name"] for c in columns if _is_json(c)}
    rowid = sa.column("rowid", sa.Integer)
    target = sa.table(table, rowid, *(sa.column(name) for name in names))
    blobs = [sa.cast(target.c[name], sa.LargeBinary) for name in names]
    # Only rows holding a NUL byte, an 0xED byte (the lead byte of an encoded surrogate) or a
    # \u escape can need a rewrite; the rest are skipped without decoding.
    needles = [sa.literal(b"\x00"), sa.literal(b"\xed"), sa.literal(b"\\u")]
    suspect = sa.or_(*(sa.func.instr(blob, needle) > 0 for blob in blobs for needle in needles))
    after = 0
    while True:
        rows = bind.execute(
            sa.select(target.c.rowid, *blobs)
            .where(target.c.rowid > after, suspect)
            .order_by(target.c.rowid)
            .limit(BATCH)
        ).all()
        if not rows:
            return
        for row in rows:
            after = row[0]
            changes: dict[str, str] = {}
            for name, raw in zip(names, row[1:], strict=True):
                if raw is None:
                    continue
                text = _clean_string(bytes(raw).decode("utf-8", "replace"))
                if name in json_names:
                    text = _cleaned_json_text(text) or text
                if text.encode("utf-8") != bytes(raw):
                    changes[name] = text
            if changes:
                bind.execute(sa.update(target).where(target.c.rowid == after).values(**changes))


def _clean_postgres_table(
    bind: sa.Connection, table: str, columns: Sequence[ReflectedColumn], keys: list[str]
) -> None:
    # Text columns cannot hold a NUL or a surrogate in PostgreSQL; json ones hold their escapes.
    documents = [c["name"] for c in columns if _is_json(c)]
    if not keys or not documents:
        return
    for name in documents:
        target = sa.table(table, *(sa.column(key) for key in keys), sa.column(name, sa.JSON))
        as_text = sa.cast(target.c[name], sa.Text)
        rows = bind.execute(
            sa.select(*(target.c[key] for key in keys), as_text).where(as_text.op("~")(_PG_SUSPECT))
        ).all()
        for row in rows:
            cleaned = _cleaned_json_text(row[-1])
            if cleaned is None:
                continue
            match = [target.c[key] == value for key, value in zip(keys, row[:-1], strict=True)]
            bind.execute(
                sa.update(target)
                .where(*match)
                .values({name: sa.cast(sa.literal(cleaned), sa.JSON)})
            )


def upgrade() -> None:
    bind = op.get_bind()
    inspector = sa.inspect(bind)
    for table in inspector.get_table_names():
        if table == "alembic_version":
            continue
        columns = list(inspector.get_columns(table))
        if bind.dialect.name == "sqlite":
            _clean_sqlite_table(bind, table, columns)
        else:
            keys = list(inspector.get_pk_constraint(table)["constrained_columns"])
            _clean_postgres_table(bind, table, columns, keys)


def downgrade() -> None:
    # The rewritten characters could not be stored again by this version, and were unreadable.
    pass
