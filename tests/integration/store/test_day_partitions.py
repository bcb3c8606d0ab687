"""Old events leave whole, by the day on PostgreSQL, row by row on SQLite; a resend across a day
boundary is still a duplicate, stored once; migration 0012 carries existing rows over and back.

Each concurrency test holds the first transaction open and waits until the second is seen
blocked on its lock, so the race is the same on any machine.

Tests ``service.store.partitions`` and ``service.store.retention``.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, func, inspect, select, text
from sqlmodel import Session

from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.store.engine import make_engine, session_scope
from service.store.events import find_event, insert_events
from service.store.migrate import alembic_config, upgrade
from service.store.models import GoldLabel, Judgment, PassageText, Score
from service.store.partitions import (
    day_number,
    day_of_key,
    ensure_days_ahead,
    partition_name,
    schema_tables,
)
from service.store.passages import read_passages
from service.store.retention import remove_events_before
from tests.support.database import blocked_on_a_lock
from tests.support.live import wait_for

SHARED = "a passage both days' events were given"
OLD_ONLY = "a passage only the old day's event was given"


def _event(query: str, texts: list[str]) -> EventIn:
    return EventIn.model_validate(
        {
            "app": "rag",
            "retriever": "bm25",
            "query": query,
            "passages": [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)],
        }
    )


def _store(engine: Engine, event_id: str, event: EventIn, now: datetime) -> str:
    with session_scope(engine) as session:
        [result] = insert_events(session, "t1", [(event_id, event)], now)
        session.commit()
    return result.outcome


def _rows(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        return {
            table.name: int(conn.execute(select(func.count()).select_from(table)).scalar_one())
            for table in schema_tables(engine.dialect.name)
        }


def _judged(engine: Engine, event_pk: int, now: datetime) -> None:
    """A grade, a score and a person's gold label for the event, as judging and labelling
    leave them."""
    with Session(engine) as session:
        session.add(
            Judgment(
                event_pk=event_pk,
                rank=1,
                judge="j",
                model="m",
                prompt_version="v",
                grade=2,
                relevant=True,
                created_at=now,
            )
        )
        session.add(
            Score(
                event_pk=event_pk,
                judge="j",
                prompt_version="v",
                alpha=1.0,
                np_window=1,
                created_at=now,
            )
        )
        session.add(
            GoldLabel(
                event_pk=event_pk,
                labeller="l",
                outcome="answered",
                passage_ids=["d0"],
                labelled_at=now,
            )
        )
        session.commit()


def test_old_events_leave_whole_and_the_texts_a_kept_event_needs_stay(store_url: str) -> None:
    engine = make_engine(store_url)
    now = utcnow()
    old_day = now - timedelta(days=3)
    ensure_days_ahead(engine, day_number(old_day), 0)  # PostgreSQL: the old day's partitions
    assert _store(engine, "old", _event("old question", [SHARED, OLD_ONLY]), old_day) == "accepted"
    assert _store(engine, "new", _event("new question", [SHARED]), now) == "accepted"
    with session_scope(engine) as session:
        old, new = find_event(session, "t1", "old"), find_event(session, "t1", "new")
    assert old is not None
    assert old.id is not None
    assert new is not None
    assert new.id is not None
    _judged(engine, old.id, old_day)
    _judged(engine, new.id, now)
    before = _rows(engine)

    removal = remove_events_before(engine, now - timedelta(days=1))

    assert removal.events == 1
    postgres = engine.dialect.name == "postgresql"
    if postgres:  # the whole day left by its partitions, no row by row
        # (The legacy partition, day -1, leaves too: nothing was stored before the layout.)
        assert [day.day for day in removal.days if day.day >= 0] == [day_number(old_day)]
        assert removal.events_row_by_row == 0
        assert day_of_key(old.id) == day_number(old_day)
        tables = set(inspect(engine).get_table_names())
        assert partition_name("events", day_number(old_day)) not in tables
        assert partition_name("passages", day_number(old_day)) not in tables
    else:
        assert removal.events_row_by_row == 1
    after = _rows(engine)
    # One event's rows of every table left (two passages, the text only it needed, one key).
    gone = {name: before[name] - after[name] for name in before if before[name] != after[name]}
    expected = {
        "events": 1, "passages": 2, "passage_texts": 1, "judgments": 1, "scores": 1,
        "gold_labels": 1,
    }  # fmt: skip
    if postgres:
        expected["event_keys"] = 1
        # Each day keeps its own copy of the texts its events refer to: the old day's two
        # left with it, today's copy of the shared one stays.
        expected["passage_texts"] = 2
    assert gone == expected
    with session_scope(engine) as session:
        assert find_event(session, "t1", "old") is None
        assert [p.text for p in read_passages(session, [new.id])[new.id]] == [SHARED]
        assert session.execute(select(PassageText)).scalars().one() is not None
    # A resend of the removed event is a new event, stored today.
    assert _store(engine, "old", _event("old question", [SHARED, OLD_ONLY]), now) == "accepted"
    engine.dispose()


@pytest.mark.postgres
def test_a_day_without_its_partition_keeps_its_events_in_the_default_one(
    postgres_url: str,
) -> None:
    engine = make_engine(postgres_url)
    far = utcnow() + timedelta(days=30)  # beyond the days created ahead
    assert _store(engine, "far", _event("q", [SHARED]), far) == "accepted"
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM events_default")).scalar_one() == 1
    # That day's partition cannot be made while its rows are in the default one: they stay.
    assert ensure_days_ahead(engine, day_number(far), 0) == []
    removal = remove_events_before(engine, far + timedelta(days=1))
    # The empty days before it left by their partitions; the event itself row by row.
    assert removal.events_row_by_row == 1
    assert sum(day.events for day in removal.days) == 0
    assert _rows(engine)["events"] == 0
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("body", ["same", "changed"])
def test_a_resend_across_a_day_boundary_waits_for_the_first_and_is_never_stored_twice(
    postgres_url: str, body: str
) -> None:
    engine = make_engine(postgres_url)
    today = utcnow()
    tomorrow = today + timedelta(days=1)
    first = _event("q", [SHARED])
    resend = first if body == "same" else _event("another question", [SHARED])
    outcome: list[Any] = []
    with session_scope(engine) as session:
        [stored] = insert_events(session, "t1", [("e1", first)], today)  # not committed yet
        assert stored.outcome == "accepted"
        thread = threading.Thread(
            target=lambda: outcome.append(_store(engine, "e1", resend, tomorrow)), daemon=True
        )
        thread.start()
        # The resend, bound for tomorrow's partition, meets today's key and waits for it.
        wait_for(blocked_on_a_lock(engine, "WITH given AS"), timeout=30)
        session.commit()
    thread.join(timeout=30)
    assert outcome == ["duplicate" if body == "same" else "conflict"]
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT id FROM events WHERE event_id = 'e1'")).scalars().all()
        keys = conn.execute(text("SELECT count(*) FROM event_keys")).scalar_one()
    assert len(rows) == 1
    assert keys == 1
    assert day_of_key(rows[0]) == day_number(today)
    engine.dispose()


@pytest.mark.postgres
def test_a_resend_after_the_first_committed_a_day_earlier_is_a_duplicate(
    postgres_url: str,
) -> None:
    engine = make_engine(postgres_url)
    today = utcnow()
    event = _event("q", [SHARED])
    assert _store(engine, "e1", event, today) == "accepted"
    for later in (1, 2, 3):
        assert _store(engine, "e1", event, today + timedelta(days=later)) == "duplicate"
    assert _rows(engine)["events"] == 1
    engine.dispose()


_OLD_ROWS = [
    "INSERT INTO events (id, tenant, event_id, payload_hash, timestamp, received_at, app, "
    "retriever, environment, query, k, passage_count, status, priority, gold, texts_kept) VALUES "
    "(7, 't1', 'before', :hash, now(), now(), 'rag', 'bm25', '', 'q', 1, 1, 'judged', 0, false, "
    "true)",
    "SELECT setval('events_id_seq', 7)",
    "INSERT INTO passage_texts (tenant, content_hash, body) VALUES ('t1', :text_hash, :body)",
    "INSERT INTO passages (event_pk, rank, passage_id, score, content_hash) VALUES "
    "(7, 1, 'd0', 1.0, :text_hash)",
    "INSERT INTO scores (event_pk, judge, prompt_version, alpha, np_window, created_at) VALUES "
    "(7, 'j', 'v', 1.0, 1, now())",
    "INSERT INTO gold_labels (event_pk, labeller, labeller_name, outcome, passage_ids, "
    "labelled_at) VALUES (7, 'l', '', 'answered', '[\"d0\"]', now())",
]


@pytest.mark.postgres
def test_migration_0012_carries_every_row_over_and_back(postgres_url: str) -> None:
    from service.primitives.hashing import text_hash
    from service.store.events import payload_hash
    from service.store.passage_body import encode_body

    engine = make_engine(postgres_url)
    config = alembic_config(postgres_url)
    event = _event("q", [SHARED])
    command.downgrade(config, "0011")
    with engine.begin() as conn:
        values = {
            "hash": payload_hash(event),
            "text_hash": text_hash(SHARED),
            "body": encode_body(SHARED),
        }
        for statement in _OLD_ROWS:
            conn.execute(text(statement), values)
    upgrade(postgres_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM events_legacy")).scalar_one() == 1
        assert conn.execute(text("SELECT event_pk FROM event_keys")).scalar_one() == 7
    # The older event is still known: its resend is a duplicate, whichever day it comes.
    assert _store(engine, "before", event, utcnow()) == "duplicate"
    assert _store(engine, "after", event, utcnow()) == "accepted"
    with session_scope(engine) as session:
        after = find_event(session, "t1", "after")
        assert after is not None
        assert after.id is not None
        assert after.id >= 1 << 36
        assert [p.text for p in read_passages(session, [7])[7]] == [SHARED]
    counts = _rows(engine)

    command.downgrade(config, "0011")
    with engine.connect() as conn:
        ids = conn.execute(text("SELECT event_id, id FROM events ORDER BY id")).all()
        kinds = conn.execute(
            text(
                "SELECT data_type FROM information_schema.columns "
                "WHERE table_name = 'events' AND column_name = 'id'"
            )
        ).scalar_one()
        referring = conn.execute(
            text("SELECT count(*) FROM passages p JOIN events e ON e.id = p.event_pk")
        ).scalar_one()
    # The new event is numbered after the older one; every reference followed it.
    assert [tuple(row) for row in ids] == [("before", 7), ("after", 8)]
    assert kinds == "integer"
    assert referring == counts["passages"]
    upgrade(postgres_url)
    again = _rows(engine)
    # The day-0 and today's copies of the one text became one row on the way down.
    assert (counts.pop("passage_texts"), again.pop("passage_texts")) == (2, 1)
    assert again == counts
    assert _store(engine, "after", event, utcnow()) == "duplicate"
    with session_scope(engine) as session:
        found = read_passages(session, [7, 8])
    assert [[p.text for p in found[pk]] for pk in (7, 8)] == [[SHARED], [SHARED]]
    engine.dispose()


def test_every_table_that_refers_to_events_leaves_with_them() -> None:
    """Read from the models, so a table added later that refers to events is covered too: it
    is partitioned with the days or deleted by the day's range, and removed row by row."""
    from sqlmodel import SQLModel

    from service.store.partitions import PARTITIONED, REFERRING
    from service.store.retention import OWNED_BY_EVENTS

    referring = {
        table.name
        for table in SQLModel.metadata.sorted_tables
        if any(key.column.table.name == "events" for key in table.foreign_keys)
    }
    assert referring  # the check below checks something
    by_day = {table for table, column in PARTITIONED if column == "event_pk"}
    assert referring == by_day | set(REFERRING)
    assert referring == set(OWNED_BY_EVENTS)
