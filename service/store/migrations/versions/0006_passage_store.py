"""passage store: each distinct passage text once per tenant, events keep references

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 13:50:00.000000

The passages table is rebuilt rather than altered: on PostgreSQL a dropped column keeps its
space (and its TOAST rows) until the table is rewritten, so only a copy gives the space back.
An empty text was an erased one (hash-only storage or retention; ingest refuses blank texts):
it becomes a released reference, and no text is stored for it.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlmodel.sql import sqltypes

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "passage_texts",
        sa.Column("tenant", sqltypes.AutoString(length=100), nullable=False),
        sa.Column("content_hash", sqltypes.AutoString(length=64), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "content_hash", name="pk_passage_texts"),
    )
    # One row per (tenant, hash): the texts of one hash are equal, MIN picks one of them.
    op.execute(
        "INSERT INTO passage_texts (tenant, content_hash, text) "
        "SELECT e.tenant, p.content_hash, MIN(p.text) FROM passages p "
        "JOIN events e ON e.id = p.event_pk WHERE p.text <> '' "
        "GROUP BY e.tenant, p.content_hash"
    )
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
        ["content_hash"],
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
