"""label cache per tenant: the tenant leads the label cache's key

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 09:00:00.000000

A grade the judge gave one tenant's (query, passage) pair is kept under that tenant, so another
tenant neither reuses it (and learns the pair was sent, from the missing judge call) nor gets a
grade made in someone else's context. Rows stored before were shared by every tenant: they are
kept under the shared scope (the empty tenant), which only a deployment sharing derived data
across tenants reads. The table is rebuilt rather than altered, since SQLite cannot change a
primary key in place. Downgrading keeps only the shared rows: the older key cannot tell tenants
apart, and the rest is a cache that judging fills again.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlmodel.sql import sqltypes

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SHARED_SCOPE = ""
_COPY_UP = (
    "INSERT INTO label_cache_next (tenant, judge, model, prompt_version, query_hash, passage_hash,"
    " grade, created_at) SELECT :shared, judge, model, prompt_version, query_hash, passage_hash,"
    " grade, created_at FROM label_cache"
)
_COPY_DOWN = (
    "INSERT INTO label_cache_next (judge, model, prompt_version, query_hash, passage_hash, grade,"
    " created_at) SELECT judge, model, prompt_version, query_hash, passage_hash, grade, created_at"
    " FROM label_cache WHERE tenant = :shared"
)


def _columns() -> list[sa.Column[object]]:
    return [
        sa.Column("judge", sqltypes.AutoString(length=100), nullable=False),
        sa.Column("model", sqltypes.AutoString(length=200), nullable=False),
        sa.Column("prompt_version", sqltypes.AutoString(length=50), nullable=False),
        sa.Column("query_hash", sqltypes.AutoString(length=64), nullable=False),
        sa.Column("passage_hash", sqltypes.AutoString(length=80), nullable=False),
        sa.Column("grade", sa.Integer(), nullable=False),
        sa.Column("created_at", sqltypes.UTCDateTime(), nullable=False),
    ]


def _replace_label_cache(with_tenant: bool) -> None:
    key = ["judge", "model", "prompt_version", "query_hash", "passage_hash"]
    columns = _columns()
    if with_tenant:
        columns.insert(0, sa.Column("tenant", sqltypes.AutoString(length=100), nullable=False))
        key.insert(0, "tenant")
    op.create_table("label_cache_next", *columns, sa.PrimaryKeyConstraint(*key))
    copy = _COPY_UP if with_tenant else _COPY_DOWN
    op.execute(sa.text(copy).bindparams(shared=_SHARED_SCOPE))
    op.drop_table("label_cache")
    op.rename_table("label_cache_next", "label_cache")
    if op.get_bind().dialect.name == "postgresql":
        # The key keeps the name PostgreSQL gives a table's own key.
        op.execute(
            "ALTER TABLE label_cache RENAME CONSTRAINT label_cache_next_pkey TO label_cache_pkey"
        )


def upgrade() -> None:
    _replace_label_cache(with_tenant=True)


def downgrade() -> None:
    _replace_label_cache(with_tenant=False)
