"""day partitions: on PostgreSQL the tables that grow with events are split by day

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 08:00:00.000000

The layout is described in ``service/store/partitions.py``. Each of events, passages,
judgments, judge_runs and scores becomes a table partitioned by ranges of the event's key, whose
high bits (from bit 36) carry the day it was stored; passage_texts gains the day in its key and
is partitioned by it (each day keeps the texts its events refer to; on SQLite, which keeps one
day, the table is rebuilt with the column, every text day 0). The rows stored before are not copied:
each existing table is attached, as it is, as the partition ``<table>_legacy`` of the keys below
``1 << 36`` (its event keys widened to 64 bits, which rewrites it once). A default partition
catches a day whose partition the scheduler has not created; the partitions of today and the
next three days are created here.

What stands in for ``UNIQUE (tenant, event_id)``, which cannot span partitions, is the table
``event_keys`` (filled here from every existing event). The foreign keys of the partitioned
tables to events go (a day's rows of every table leave together); those of gold_labels and
miss_causes stay, to the partitioned events.

Downgrading copies every partition back into plain tables with their old constraints and 32-bit
keys, and drops ``event_keys``: the keys made under the layout do not fit 32 bits, so those
events are numbered after the older ones, in the order they were made, and every row that
refers to them follows. Stop the workers first: a judge message names events by key. SQLite is
unchanged.
"""

from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta

from alembic import op

# Every statement here is built from the constants below (table, column and constraint names,
# integers), never from a value read or received.

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_SHIFT = 36
_MASK = (1 << _SHIFT) - 1
_DAYS_AHEAD = 3
# (table, partition column, old primary key, new primary key, indexes, unique constraints). A
# primary key must hold the partition key; the id leads it, so reading rows in id order (the
# aggregates' rebuild pages the scores so) stays an index scan of each partition.
_TABLES: tuple[tuple[str, str, str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("passage_texts", "day", "(tenant, content_hash)", "(tenant, content_hash, day)", (), ()),
    (
        "events",
        "id",
        "(id)",
        "(id)",
        (
            "ix_events_status_enqueued ON events (status, enqueued_at)",
            "ix_events_received ON events (received_at)",
            "ix_events_status_received ON events (status, received_at)",
            "ix_events_gold_received ON events (received_at) WHERE gold",
            "ix_events_gold_tenant_received ON events (tenant, received_at) WHERE gold",
        ),
        (),
    ),
    (
        "passages",
        "event_pk",
        "(event_pk, rank)",
        "(event_pk, rank)",
        (
            "ix_passages_live_hash ON passages (substr((content_hash)::text, 1, 16)) "
            "WHERE (NOT text_released)",
        ),
        (),
    ),
    (
        "judgments",
        "event_pk",
        "(id)",
        "(id, event_pk)",
        ("ix_judgments_event_pk ON judgments (event_pk)",),
        ("uq_judgments_event_rank_judge UNIQUE (event_pk, rank, judge, prompt_version)",),
    ),
    (
        "judge_runs",
        "event_pk",
        "(id)",
        "(id, event_pk)",
        ("ix_judge_runs_event_pk ON judge_runs (event_pk)",),
        ("uq_judge_runs_event_judge UNIQUE (event_pk, judge, prompt_version)",),
    ),
    (
        "scores",
        "event_pk",
        "(id)",
        "(id, event_pk)",
        ("ix_scores_event_pk ON scores (event_pk)",),
        ("uq_scores_event_judge UNIQUE (event_pk, judge, prompt_version)",),
    ),
)
_OLD_FOREIGN_KEYS = {
    "passages": "passage_refs_new_event_pk_fkey",
    "judgments": "judgments_event_pk_fkey",
    "judge_runs": "judge_runs_event_pk_fkey",
    "scores": "scores_event_pk_fkey",
    "gold_labels": "gold_labels_event_pk_fkey",
    "miss_causes": "miss_causes_event_pk_fkey",
}
_REFERRING = ("gold_labels", "miss_causes")
_KEY_NAMES = {"passages": "pk_passages", "passage_texts": "pk_passage_texts"}


def _key_name(table: str) -> str:
    return _KEY_NAMES.get(table, f"{table}_pkey")


def _bounds(column: str, day: int) -> tuple[int, int]:
    """A day's range: of days (the texts), or of event keys."""
    return (day, day + 1) if column == "day" else (day << _SHIFT, (day + 1) << _SHIFT)


def _texts_with_days(with_days: bool) -> None:
    """SQLite: passage_texts rebuilt with (or without) the day in its key, as SQLite cannot
    change a primary key in place. Every text there is day 0."""
    columns = "tenant, content_hash, body"
    op.execute(
        "CREATE TABLE passage_texts_next (tenant VARCHAR(100) NOT NULL, "
        "content_hash VARCHAR(64) NOT NULL, body BLOB NOT NULL"
        + (", day INTEGER DEFAULT '0' NOT NULL" if with_days else "")
        + ", CONSTRAINT pk_passage_texts PRIMARY KEY (tenant, content_hash"
        + (", day))" if with_days else "))")
    )
    op.execute(
        f"INSERT INTO passage_texts_next ({columns}) "  # noqa: S608
        f"SELECT {columns} FROM passage_texts" + ("" if with_days else " WHERE day = 0")
    )
    op.execute("DROP TABLE passage_texts")
    op.execute("ALTER TABLE passage_texts_next RENAME TO passage_texts")


_SEQUENCES = {"events": "events_id_seq", "judgments": "judgments_id_seq",
              "judge_runs": "judge_runs_id_seq", "scores": "scores_id_seq"}  # fmt: skip


def _index_name(definition: str) -> str:
    return definition.split(" ", 1)[0]


def _day(moment: date) -> int:
    return (moment - date(1970, 1, 1)).days


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        _texts_with_days(True)
        return
    op.execute("ALTER TABLE passage_texts ADD COLUMN day integer DEFAULT 0 NOT NULL")
    for table, name in _OLD_FOREIGN_KEYS.items():
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {name}")
    op.execute("ALTER TABLE events DROP CONSTRAINT uq_events_tenant_event_id")
    for table, column, _old_key, new_key, indexes, uniques in _TABLES:
        legacy = f"{table}_legacy"
        op.execute(f"ALTER TABLE {table} RENAME TO {legacy}")
        if column != "day":
            op.execute(f"ALTER TABLE {legacy} ALTER COLUMN {column} TYPE bigint")
        # Index and constraint names are the schema's: the partitioned table takes them.
        op.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT IF EXISTS {table}_pkey")
        op.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT IF EXISTS pk_{table}")
        for definition in indexes:
            op.execute(f"DROP INDEX IF EXISTS {_index_name(definition)}")
        for definition in uniques:
            op.execute(f"ALTER TABLE {legacy} DROP CONSTRAINT {_index_name(definition)}")
        op.execute(
            f"CREATE TABLE {table} (LIKE {legacy} INCLUDING DEFAULTS) PARTITION BY RANGE ({column})"
        )
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {_key_name(table)} PRIMARY KEY {new_key}")
        for definition in uniques:
            op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {definition}")
        for definition in indexes:
            op.execute(f"CREATE INDEX {definition}")
        if table in _SEQUENCES:
            sequence = _SEQUENCES[table]
            op.execute(f"ALTER SEQUENCE {sequence} AS bigint OWNED BY {table}.id")
        op.execute(
            f"ALTER TABLE {table} ATTACH PARTITION {legacy} "
            f"FOR VALUES FROM (MINVALUE) TO ({_bounds(column, 0)[1]})"
        )
        op.execute(f"CREATE TABLE {table}_default PARTITION OF {table} DEFAULT")
    # A new event's key: the day it is stored, then the sequence (ingest gives the day itself).
    op.execute(
        "ALTER TABLE events ALTER COLUMN id SET DEFAULT "
        f"((floor(extract(epoch FROM now()) / 86400))::bigint << {_SHIFT}) "
        f"| (nextval('events_id_seq') & {_MASK})"
    )
    today = _day(datetime.now(UTC).date())
    for day in range(today, today + _DAYS_AHEAD + 1):
        suffix = f"d{date(1970, 1, 1) + timedelta(days=day):%Y%m%d}"
        for table, column, *_rest in _TABLES:
            low, high = _bounds(column, day)
            op.execute(
                f"CREATE TABLE {table}_{suffix} PARTITION OF {table} "
                f"FOR VALUES FROM ({low}) TO ({high})"
            )
    op.execute(
        "CREATE TABLE event_keys ("
        " tenant varchar(100) NOT NULL, event_id varchar(200) NOT NULL, event_pk bigint NOT NULL,"
        " CONSTRAINT pk_event_keys PRIMARY KEY (tenant, event_id))"
    )
    op.execute(
        "INSERT INTO event_keys (tenant, event_id, event_pk) "
        "SELECT tenant, event_id, id FROM events"
    )
    for table in _REFERRING:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN event_pk TYPE bigint")
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {_OLD_FOREIGN_KEYS[table]} "
            "FOREIGN KEY (event_pk) REFERENCES events (id)"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        _texts_with_days(False)
        return
    for table in _REFERRING:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {_OLD_FOREIGN_KEYS[table]}")
    for table, *_rest in _TABLES:
        plain = f"{table}_plain"
        op.execute(f"CREATE TABLE {plain} (LIKE {table} INCLUDING DEFAULTS)")
        op.execute(f"INSERT INTO {plain} SELECT * FROM {table}")  # noqa: S608
        if table in _SEQUENCES:
            op.execute(f"ALTER SEQUENCE {_SEQUENCES[table]} OWNED BY NONE")
        op.execute(f"DROP TABLE {table} CASCADE")
        op.execute(f"ALTER TABLE {plain} RENAME TO {table}")
    # The keys made under the layout do not fit the older 32-bit columns: each is given the next
    # number after the older keys, in the order they were made; the older keys stay as they were.
    op.execute(
        "CREATE TEMPORARY TABLE key_map ON COMMIT DROP AS SELECT id AS old, "  # noqa: S608
        f"(SELECT coalesce(max(id), 0) FROM events WHERE id < {1 << 31}) "
        f"+ row_number() OVER (ORDER BY id) AS new FROM events WHERE id >= {1 << 31}"
    )
    op.execute("CREATE INDEX ON key_map (old)")
    op.execute("UPDATE events SET id = m.new FROM key_map m WHERE events.id = m.old")
    for table in (*(t for t, c, *_ in _TABLES if c == "event_pk"), *_REFERRING):
        op.execute(f"UPDATE {table} SET event_pk = m.new FROM key_map m WHERE event_pk = m.old")  # noqa: S608
        op.execute(f"ALTER TABLE {table} ALTER COLUMN event_pk TYPE integer")
    op.execute("ALTER TABLE events ALTER COLUMN id TYPE integer")
    for table, sequence in _SEQUENCES.items():
        op.execute(f"ALTER SEQUENCE {sequence} AS integer OWNED BY {table}.id")
        op.execute(
            f"SELECT setval('{sequence}', (SELECT coalesce(max(id), 0) + 1 FROM {table}), false)"  # noqa: S608
        )
    # A text kept by several days is one row again, without its day.
    op.execute(
        "DELETE FROM passage_texts t USING passage_texts o WHERE t.tenant = o.tenant "
        "AND t.content_hash = o.content_hash AND t.day > o.day"
    )
    op.execute("ALTER TABLE passage_texts DROP COLUMN day")
    for table, _column, old_key, _new_key, indexes, uniques in _TABLES:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {_key_name(table)} PRIMARY KEY {old_key}")
        for definition in uniques:
            op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {definition}")
        for definition in indexes:
            op.execute(f"CREATE INDEX {definition}")
    op.execute("ALTER TABLE events ALTER COLUMN id SET DEFAULT nextval('events_id_seq')")
    op.execute(
        "ALTER TABLE events ADD CONSTRAINT uq_events_tenant_event_id UNIQUE (tenant, event_id)"
    )
    op.execute("DROP TABLE event_keys")
    for table, name in _OLD_FOREIGN_KEYS.items():
        op.execute(
            f"ALTER TABLE {table} ADD CONSTRAINT {name} "
            "FOREIGN KEY (event_pk) REFERENCES events (id)"
        )
