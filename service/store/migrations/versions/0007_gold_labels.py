"""gold labels

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 13:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlmodel.sql import sqltypes

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gold_labels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("event_pk", sa.Integer(), nullable=False),
        sa.Column("labeller", sqltypes.AutoString(length=200), nullable=False),
        sa.Column("labeller_name", sqltypes.AutoString(length=200), nullable=False),
        sa.Column("outcome", sqltypes.AutoString(length=32), nullable=False),
        sa.Column("passage_ids", sa.JSON(), nullable=False),
        sa.Column("missing_text", sa.Text(), nullable=True),
        sa.Column("answer_correct", sa.Boolean(), nullable=True),
        sa.Column("labelled_at", sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["event_pk"], ["events.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("event_pk", "labeller", name="uq_gold_labels_event_labeller"),
    )
    with op.batch_alter_table("gold_labels", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_gold_labels_event_pk"), ["event_pk"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("gold_labels", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_gold_labels_event_pk"))
    op.drop_table("gold_labels")
