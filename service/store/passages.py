"""The passages aggregate: each distinct passage text stored once per tenant, and each event's
ranked references to it.

A retriever over a corpus returns the same chunks to many queries, so a text is paid for once:
``passage_texts`` holds it under (tenant, content hash), and ``passages`` keeps per event only the
rank, the app's passage id, the score and the hash. The text is kept compressed when that saves
bytes (``service.store.passage_body``). Every reader goes through ``read_passages``, which gives
the text back as if each event kept its own copy.

A reference is released when its event no longer needs the text (judged under hash-only
storage, or purged after the retention period); the event then reads an empty text, as it did
when the text was erased in place. A text that no unreleased reference needs is deleted in the
same transaction (``release_texts``). The race with ingest (a new event referring to a text
being deleted) is settled by a table lock on PostgreSQL; SQLite has one writer at a time.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam
from sqlalchemy import text as sql_text
from sqlmodel import Session

from service.store.binary_arrays import (
    BYTEA_OID,
    FLOAT8_OID,
    INT8_OID,
    TEXT_OID,
    column_array,
)
from service.store.driver import driver_errors
from service.store.partitions import DAY_SHIFT
from service.store.passage_body import RecentForms, decode_body


@dataclass(frozen=True)
class PassageRow:
    """One ranked passage of one event."""

    event_pk: int
    rank: int
    passage_id: str
    score: float | None
    content_hash: str
    text: str


@dataclass(frozen=True)
class StoredPassage(PassageRow):
    """One ranked passage as read back; ``text`` is empty once the event released it."""


# --- writing: a fixed number of statements per commit group, whatever its size ------------------

_TEXTS_INSERT_SQLITE = (
    "INSERT INTO passage_texts (tenant, content_hash, body) VALUES (?, ?, ?) ON CONFLICT DO NOTHING"
)
_REFERENCES_INSERT = (
    "INSERT INTO passages (event_pk, rank, passage_id, score, content_hash) VALUES (?, ?, ?, ?, ?)"
)


_RECENT = RecentForms()


def stored_forms(texts: Iterable[tuple[str, str]]) -> dict[str, bytes]:
    """Each distinct (hash, text)'s stored form, sorted by hash: two transactions inserting the
    same new texts then take their unique-key locks in one order and wait instead of
    deadlocking."""
    return {digest: _RECENT.form(digest, text) for digest, text in sorted(dict(texts).items())}


# PostgreSQL writes the references and the texts in the statement that inserts their events
# (``service/store/event_rows.py``): these data-modifying WITH queries follow the one named
# ``new_events`` (RETURNING id, event_id). Parameters, in order: the references' five arrays
# (event id, rank, passage id, score, hash), the tenant, the day (of the events' keys), the
# texts' hashes and stored forms. Only the events inserted get references, and only their texts
# are stored: a resent event's texts may have been purged with it, and must not come back
# without a reference.
POSTGRES_PASSAGES_WITH = """
given_passages AS (
    SELECT * FROM unnest(%b::varchar[], %b::integer[], %b::varchar[], %b::float8[], %b::varchar[])
        AS given(event_id, rank, passage_id, score, content_hash)
),
new_references AS (
    INSERT INTO passages (event_pk, rank, passage_id, score, content_hash)
    SELECT e.id, r.rank, r.passage_id, r.score, r.content_hash
    FROM given_passages r JOIN new_events e ON e.event_id = r.event_id
),
new_texts AS (
    INSERT INTO passage_texts (tenant, day, content_hash, body)
    SELECT %s, %b::integer, t.digest, t.body
    FROM unnest(%b::varchar[], %b::bytea[]) AS t(digest, body)
    WHERE t.digest IN (
        SELECT r.content_hash FROM given_passages r JOIN new_events e ON e.event_id = r.event_id
    )
    ORDER BY t.digest
    ON CONFLICT DO NOTHING
)
"""


def postgres_passage_parameters(
    tenant: str,
    day: int,
    passages: Sequence[tuple[str, int, str, float | None, str, str]],
    encode: bool = True,
) -> list[object]:
    """The parameters of ``POSTGRES_PASSAGES_WITH`` for (event id, rank, passage id, score,
    hash, text) rows of events stored on ``day``; ``encode``: the arrays already in binary
    (``binary_arrays``), else as lists."""
    texts = stored_forms((row[4], row[5]) for row in passages)
    return [
        column_array([row[0] for row in passages], TEXT_OID, encode),
        column_array([row[1] for row in passages], INT8_OID, encode),
        column_array([row[2] for row in passages], TEXT_OID, encode),
        column_array([row[3] for row in passages], FLOAT8_OID, encode),
        column_array([row[4] for row in passages], TEXT_OID, encode),
        tenant,
        day,
        column_array(list(texts), TEXT_OID, encode),
        column_array(list(texts.values()), BYTEA_OID, encode),
    ]


# (event key, rank, passage id, score, content hash, text): a passage of a stored event to write;
# a plain tuple, as the driver takes it, not an object per passage.
KeyedPassage = tuple[int, int, str, float | None, str, str]


def store_passages(session: Session, tenant: str, rows: Sequence[KeyedPassage]) -> None:
    """Write new events' passages on SQLite, inside the session's transaction: the texts not yet
    stored for the tenant, then every reference (PostgreSQL writes them in the events' own
    statement: ``POSTGRES_PASSAGES_WITH``).

    Two prepared statements whatever the number of events: the distinct texts, skipping those
    already stored (INSERT ... ON CONFLICT DO NOTHING), and the references. Plain tuples go
    straight to the driver: SQLAlchemy's per-row parameter processing was most of the cost of
    this step. Each distinct text is encoded once per commit group, stored or not (telling which
    are new would cost another statement); the forms of recent texts are kept (``RecentForms``).
    """
    if not rows:
        return
    texts = stored_forms((row[4], row[5]) for row in rows)
    references = [row[:5] for row in rows]
    connection = session.connection()
    driver: Any = connection.connection.driver_connection
    with driver_errors(connection, _TEXTS_INSERT_SQLITE):
        cursor = driver.cursor()
        try:
            cursor.executemany(
                _TEXTS_INSERT_SQLITE, [(tenant, digest, body) for digest, body in texts.items()]
            )
            cursor.executemany(_REFERENCES_INSERT, references)
        finally:
            cursor.close()


# --- reading: the text as if each event kept its own copy ---------------------------------------

# A released reference (or a text already deleted) reads as an empty text: a purge never breaks
# a read. The events' ids on both sides of the join: with them only on passages, PostgreSQL
# hash-joins a sequential scan of every event. A text is its day's copy: the day its event's
# key carries (0 on SQLite and for every event stored before the day layout).
_READ = f"""
SELECT p.event_pk, p.rank, p.passage_id, p.score, p.content_hash, t.body
FROM passages p
JOIN events e ON e.id = p.event_pk
LEFT JOIN passage_texts t
  ON t.tenant = e.tenant AND t.content_hash = p.content_hash AND NOT p.text_released
  AND t.day = (p.event_pk >> {DAY_SHIFT})
WHERE p.event_pk IN :pks AND e.id IN :pks {{window}}
ORDER BY p.event_pk, p.rank
"""  # noqa: S608 (built from constants)
_READ_ALL = sql_text(_READ.replace("{window}", "")).bindparams(bindparam("pks", expanding=True))
_READ_JUDGED_WINDOW = sql_text(_READ.replace("{window}", "AND p.rank <= 2 * e.k")).bindparams(
    bindparam("pks", expanding=True)
)


def read_passages(
    session: Session, event_pks: Sequence[int], judged_window_only: bool = False
) -> dict[int, list[StoredPassage]]:
    """The passages of events in rank order, by event key (an event without any: absent).

    ``judged_window_only``: only the ranks the judge reads (the top 2k).
    """
    if not event_pks:
        return {}
    statement = _READ_JUDGED_WINDOW if judged_window_only else _READ_ALL
    found: dict[int, list[StoredPassage]] = {}
    # Events of one batch share texts: each distinct body is decompressed once.
    decoded: dict[bytes | None, str] = {None: ""}
    for row in session.execute(statement, {"pks": list(dict.fromkeys(event_pks))}):
        body = None if row[5] is None else bytes(row[5])
        if body not in decoded:
            decoded[body] = decode_body(body)
        passage = StoredPassage(row[0], row[1], row[2], row[3], row[4], decoded[body])
        found.setdefault(passage.event_pk, []).append(passage)
    return found


# --- releasing: a text lives while an unreleased reference needs it -----------------------------

_RELEASE = sql_text(
    "UPDATE passages SET text_released = :released WHERE event_pk IN :pks AND text_released = :kept"
).bindparams(bindparam("pks", expanding=True))

# Texts the given events referred to that no unreleased reference of the same tenant and day
# needs. The candidates drive the statement (each looked up by the primary key, never a scan of
# every text), and the NOT EXISTS reads the partial index ix_passages_live_hash: through its key
# (the hash's first 16 hex digits, spelled exactly as the index is), then the whole hash, among
# the day's keys only (on PostgreSQL one partition's index).
UNNEEDED_TEXTS = f"""
DELETE FROM passage_texts
WHERE (tenant, content_hash, day) IN (
    SELECT e.tenant, p.content_hash, p.event_pk >> {DAY_SHIFT}
    FROM passages p JOIN events e ON e.id = p.event_pk
    WHERE p.event_pk IN :pks AND e.id IN :pks
)
AND NOT EXISTS (
    SELECT 1 FROM passages live JOIN events owner ON owner.id = live.event_pk
    WHERE substr(live.content_hash, 1, 16) = substr(passage_texts.content_hash, 1, 16)
      AND live.content_hash = passage_texts.content_hash AND NOT live.text_released
      AND owner.tenant = passage_texts.tenant
      AND live.event_pk >= passage_texts.day * {1 << DAY_SHIFT}
      AND live.event_pk < (passage_texts.day + 1) * {1 << DAY_SHIFT}
      {{also}}
)
"""  # noqa: S608 (built from constants)
_DELETE_UNNEEDED = sql_text(UNNEEDED_TEXTS.replace("{also}", "")).bindparams(
    bindparam("pks", expanding=True)
)

# Ingest inserts texts under ROW EXCLUSIVE, which this mode conflicts with (and readers' ACCESS
# SHARE does not): once granted, every transaction that may have referred to one of these texts
# has committed, and the DELETE's snapshot, taken after, sees its references. Ingest waits for
# the purge's commit at most, and then stores a deleted text again.
_LOCK_TEXTS = sql_text("LOCK TABLE passage_texts IN SHARE ROW EXCLUSIVE MODE")


def release_texts(session: Session, event_pks: Sequence[int]) -> int:
    """These events no longer need their passage texts: they read empty texts from now on, and
    each text no other unreleased reference of the tenant needs is deleted. Returns the texts
    deleted. The hashes stay. The caller commits (soon: on PostgreSQL ingest waits meanwhile).
    """
    if not event_pks:
        return 0
    pks = list(dict.fromkeys(event_pks))
    session.execute(_RELEASE, {"pks": pks, "released": True, "kept": False})
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_LOCK_TEXTS)
    deleted = session.execute(_DELETE_UNNEEDED, {"pks": pks})
    return int(deleted.rowcount or 0)  # type: ignore[attr-defined]
