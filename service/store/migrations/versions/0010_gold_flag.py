"""gold flag: events say whether they carry gold ids, with a partial index on the gold ones

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 13:00:00.000000

A non-gold event stores the JSON text null in ``gold_passage_ids``, which no index tells from a
list, so finding a window's gold events (the judge's calibration gauges, refreshed every minute
by each API process) read every event of the window. ``gold`` says it in a column of its own,
and two partial indexes (by time, and by tenant and time) hold the gold events only. Existing
rows are marked from their ids: one pass over the table, once; the new column's default is
false, which PostgreSQL adds without rewriting the table. Downgrading drops the indexes and the
column.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Kept here rather than imported: a migration must do the same thing whatever the code becomes.
# JSON null and an empty list (which older versions accepted) are not gold; the text of the JSON
# compares the same way on both stores (PostgreSQL's json type has no equality operator).
_MARK_GOLD = (
    "UPDATE events SET gold = :gold "
    "WHERE gold_passage_ids IS NOT NULL "
    "AND CAST(gold_passage_ids AS VARCHAR) NOT IN ('null', '[]')"
)

_INDEXES = {
    "ix_events_gold_received": ["received_at"],
    "ix_events_gold_tenant_received": ["tenant", "received_at"],
}


def upgrade() -> None:
    op.add_column(
        "events", sa.Column("gold", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.execute(sa.text(_MARK_GOLD).bindparams(gold=True))
    for name, columns in _INDEXES.items():
        op.create_index(
            name,
            "events",
            columns,
            unique=False,
            sqlite_where=sa.text("gold = 1"),
            postgresql_where=sa.text("gold"),
        )


def downgrade() -> None:
    for name in _INDEXES:
        op.drop_index(name, table_name="events")
    # In place, not by a batch's copy of the table: SQLite (3.35 on) drops a column no index
    # or key uses, and the copy's DROP TABLE would fail on the rows that refer to events.
    op.drop_column("events", "gold")
