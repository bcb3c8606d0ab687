"""passage store: each distinct passage text once per tenant, events keep references

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 13:50:00.000000

The passages table is rebuilt rather than altered: on PostgreSQL a dropped column keeps its
space (and its TOAST rows) until the table is rewritten, so only a copy gives the space back.
An empty text was an erased one (hash-only storage or retention; ingest refuses blank texts):
it becomes a released reference, and no text is stored for it.

Each text is stored as ``service.store.passage_body`` writes it (one format byte, then its UTF-8,
zlib-compressed when that is shorter), so an upgraded database holds what a new one would. The
texts are first made readable: an older version could leave a NUL or bytes that are not UTF-8 in
SQLite's text column, which migration 0008 cleans in every text column it can see; a compressed
body is not one, so the cleaning happens here, the same way (each such character becomes U+FFFD).
The downgrade gives every reference its plain text back.
"""

import re
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlmodel.sql import sqltypes

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 1000
# Kept here rather than imported: a migration must do the same thing whatever the code becomes.
PLAIN = b"u"
ZLIB = b"z"
LEVEL = 6
REPLACEMENT = "\ufffd"
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def _body(raw: bytes | str) -> bytes:
    """The stored form of a text as the 0005 schema held it (SQLite: its raw bytes)."""
    text = raw if isinstance(raw, str) else raw.decode("utf-8", "replace")
    encoded = _UNSTORABLE.sub(REPLACEMENT, text).encode("utf-8")
    packed = zlib.compress(encoded, LEVEL)
    return ZLIB + packed if len(packed) < len(encoded) else PLAIN + encoded


def _text(body: bytes | None) -> str:
    if not body:
        return ""
    kind, payload = body[:1], bytes(body[1:])
    if kind == ZLIB:
        payload = zlib.decompress(payload)
    return payload.decode("utf-8", "replace")


def _keyed_batches(
    bind: sa.Connection, table: str, value: sa.ColumnElement[Any]
) -> Iterator[Sequence[Any]]:
    """(tenant, content_hash, value) of a table keyed by both, in batches of key order, each
    read before it is written: memory stays bounded however many texts there are."""
    rows = sa.table(table, sa.column("tenant", sa.String), sa.column("content_hash", sa.String))
    tenant, digest = rows.c.tenant, rows.c.content_hash
    after: tuple[str, str] | None = None
    while True:
        query = sa.select(tenant, digest, value).select_from(rows)
        if after is not None:
            query = query.where(
                sa.or_(tenant > after[0], sa.and_(tenant == after[0], digest > after[1]))
            )
        batch = bind.execute(query.order_by(tenant, digest).limit(BATCH)).all()
        if not batch:
            return
        after = (batch[-1][0], batch[-1][1])
        yield batch


def upgrade() -> None:
    op.create_table(
        "passage_texts",
        sa.Column("tenant", sqltypes.AutoString(length=100), nullable=False),
        sa.Column("content_hash", sqltypes.AutoString(length=64), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "content_hash", name="pk_passage_texts"),
    )
    # One row per (tenant, hash), first as it was stored: the texts of one hash are equal, MIN
    # picks one of them. Then each is stored in its new form, in batches.
    op.create_table(
        "passage_texts_plain",
        sa.Column("tenant", sqltypes.AutoString(length=100), nullable=False),
        sa.Column("content_hash", sqltypes.AutoString(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "content_hash", name="pk_passage_texts_plain"),
    )
    op.execute(
        "INSERT INTO passage_texts_plain (tenant, content_hash, text) "
        "SELECT e.tenant, p.content_hash, MIN(p.text) FROM passages p "
        "JOIN events e ON e.id = p.event_pk WHERE p.text <> '' "
        "GROUP BY e.tenant, p.content_hash"
    )
    bind = op.get_bind()
    plain = sa.column("text", sa.Text)
    # SQLite hands over the raw bytes, which may not be UTF-8.
    stored = sa.cast(plain, sa.LargeBinary) if bind.dialect.name == "sqlite" else plain
    texts = sa.table(
        "passage_texts",
        sa.column("tenant", sa.String),
        sa.column("content_hash", sa.String),
        sa.column("body", sa.LargeBinary),
    )
    for batch in _keyed_batches(bind, "passage_texts_plain", stored):
        bind.execute(
            texts.insert(),
            [{"tenant": t, "content_hash": h, "body": _body(raw)} for t, h, raw in batch],
        )
    op.drop_table("passage_texts_plain")
    op.create_table(
        "passage_refs_new",
        sa.Column("event_pk", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("passage_id", sqltypes.AutoString(length=200), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("content_hash", sqltypes.AutoString(length=64), nullable=False),
        sa.Column("text_released", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.ForeignKeyConstraint(["event_pk"], ["events.id"]),
        sa.PrimaryKeyConstraint("event_pk", "rank", name="pk_passages"),
    )
    op.execute(
        "INSERT INTO passage_refs_new "
        "(event_pk, rank, passage_id, score, content_hash, text_released) "
        "SELECT event_pk, rank, passage_id, score, content_hash, text = '' FROM passages"
    )
    with op.batch_alter_table("passages", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_passages_event_pk"))
    op.drop_table("passages")
    op.rename_table("passage_refs_new", "passages")
    op.create_index(
        "ix_passages_live_hash",
        "passages",
        [sa.text("substr(content_hash, 1, 16)")],
        unique=False,
        sqlite_where=sa.text("NOT text_released"),
        postgresql_where=sa.text("NOT text_released"),
    )


def downgrade() -> None:
    op.create_table(
        "passages_with_text",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("event_pk", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("passage_id", sqltypes.AutoString(length=200), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("score", sa.Float(), nullable=True),
        sa.Column("content_hash", sqltypes.AutoString(length=64), nullable=False),
        sa.ForeignKeyConstraint(["event_pk"], ["events.id"]),
        sa.PrimaryKeyConstraint("id", name="passages_pkey"),
        sa.UniqueConstraint("event_pk", "rank", name="uq_passages_event_rank"),
    )
    # The plain texts beside the stored forms, for the copy below.
    op.add_column("passage_texts", sa.Column("text", sa.Text(), nullable=True))
    bind = op.get_bind()
    texts = sa.table(
        "passage_texts",
        sa.column("tenant", sa.String),
        sa.column("content_hash", sa.String),
        sa.column("text", sa.Text),
    )
    for batch in _keyed_batches(bind, "passage_texts", sa.column("body", sa.LargeBinary)):
        for row in batch:
            bind.execute(
                texts.update()
                .where(texts.c.tenant == row[0], texts.c.content_hash == row[1])
                .values(text=_text(row[2]))
            )
    # Every reference gets its own copy of the text again; a released one reads empty, as before.
    op.execute(
        "INSERT INTO passages_with_text (event_pk, rank, passage_id, text, score, content_hash) "
        "SELECT p.event_pk, p.rank, p.passage_id, "
        "CASE WHEN p.text_released THEN '' ELSE COALESCE(t.text, '') END, "
        "p.score, p.content_hash FROM passages p JOIN events e ON e.id = p.event_pk "
        "LEFT JOIN passage_texts t ON t.tenant = e.tenant AND t.content_hash = p.content_hash "
        "ORDER BY p.event_pk, p.rank"
    )
    op.drop_index("ix_passages_live_hash", table_name="passages")
    op.drop_table("passages")
    op.drop_table("passage_texts")
    op.rename_table("passages_with_text", "passages")
    op.create_index("ix_passages_event_pk", "passages", ["event_pk"], unique=False)
