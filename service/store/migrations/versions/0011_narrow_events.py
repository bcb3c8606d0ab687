"""narrow events: a flag for the events stored without their texts

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 23:00:00.000000

With ``RM_KEEP_TEXTS=needed`` an event nothing will judge is stored as a narrow row: its
identity, time, labels, counts and status, without query, passages, candidates, response or
metadata. ``texts_kept`` tells such a row from an event whose texts were purged after
retention (whose passage references stay). Every existing event kept its texts: the column's
default is true, which PostgreSQL adds without rewriting the table. Downgrading drops the column;
the narrow rows stay, as events with an empty query and no passages, as a purge leaves them.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "events", sa.Column("texts_kept", sa.Boolean(), server_default=sa.true(), nullable=False)
    )


def downgrade() -> None:
    # In place, not by a batch's copy of the table: SQLite (3.35 on) drops a column no index
    # or key uses, and the copy's DROP TABLE would fail on the rows that refer to events.
    op.drop_column("events", "texts_kept")
