"""Storing a batch: the bulk insert on SQLite and PostgreSQL, its outcomes and initial states.

Tests ``service.store.events`` and ``service.store.dialect``.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlmodel import col

from service.api.app import create_app
from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.primitives.hashing import text_hash
from service.store.engine import make_engine, session_scope
from service.store.events import InitialState, insert_events
from service.store.models import Event, EventStatus
from service.store.passages import read_passages
from tests.support.environment import make_settings
from tests.support.helpers import make_event


def _event(event_id: str, n: int = 3, **extra: Any) -> EventIn:
    return EventIn.model_validate(make_event(event_id, n=n, query=f"query of {event_id}", **extra))


def test_a_batch_stores_every_event_with_its_own_passages(store_url: str) -> None:
    engine = make_engine(store_url)
    events = [(f"ev-{i}", _event(f"ev-{i}", n=1 + i % 4)) for i in range(30)]
    # Text with characters COPY's text format must escape.
    events.append(("odd", _event("odd", passages=[{"text": "tab\there\nnew line \\ back"}])))
    with session_scope(engine) as session:
        stored = insert_events(session, "t1", events, utcnow())
        session.commit()
    assert [r.event_id for r in stored] == [event_id for event_id, _ in events]
    assert all(r.outcome == "accepted" and r.pk is not None for r in stored)
    with session_scope(engine) as session:
        for (event_id, event), result in zip(events, stored, strict=True):
            row = session.get(Event, result.pk)
            assert row is not None
            # The key each event got back is its own row's, not a neighbour's.
            assert (row.event_id, row.query, row.tenant) == (event_id, event.query, "t1")
            assert row.passage_count == len(event.passages)
            assert result.pk is not None
            passages = read_passages(session, [result.pk])[result.pk]
            got = [(p.rank, p.text, p.score, p.content_hash) for p in passages]
            want = [
                (rank, p.text, p.score, text_hash(p.text))
                for rank, p in enumerate(event.passages, start=1)
            ]
            assert got == want
    engine.dispose()


def test_known_ids_and_repeats_in_a_batch_are_duplicates_or_conflicts(store_url: str) -> None:
    engine = make_engine(store_url)
    with session_scope(engine) as session:
        insert_events(session, "t1", [("old", _event("old"))], utcnow())
        session.commit()
    batch = [
        ("new", _event("new")),
        ("old", _event("old")),  # a resend of a stored event
        ("new", _event("new")),  # the same event twice in one batch
        ("old", _event("old", n=5)),  # a stored id with other content
        ("new", _event("new", n=2)),  # an id of this batch with other content
        ("other", _event("other")),
    ]
    with session_scope(engine) as session:
        stored = insert_events(session, "t1", batch, utcnow())
        session.commit()
    assert [r.outcome for r in stored] == [
        "accepted",
        "duplicate",
        "duplicate",
        "conflict",
        "conflict",
        "accepted",
    ]
    assert [r.pk is not None for r in stored] == [True, False, False, False, False, True]
    # The same id in another tenant is another event.
    with session_scope(engine) as session:
        (elsewhere,) = insert_events(session, "t2", [("old", _event("old"))], utcnow())
        session.commit()
        assert elsewhere.outcome == "accepted"
        ids = session.execute(select(col(Event.tenant), col(Event.event_id))).all()
    assert sorted(ids) == [("t1", "new"), ("t1", "old"), ("t1", "other"), ("t2", "old")]
    engine.dispose()


def test_initial_states_are_written_by_the_insert(store_url: str) -> None:
    engine = make_engine(store_url)
    initial = {
        "skipped": InitialState(skip_reason="unsampled"),
        "urgent": InitialState(priority=1),
    }
    batch = [(name, _event(name)) for name in ("skipped", "urgent", "plain")]
    with session_scope(engine) as session:
        insert_events(session, "t1", batch, utcnow(), initial)
        session.commit()
        rows = {
            row.event_id: (row.status, row.skip_reason, row.priority)
            for row in session.execute(select(Event)).scalars()
        }
    assert rows == {
        "skipped": (EventStatus.SKIPPED.value, "unsampled", 0),
        "urgent": (EventStatus.PENDING.value, None, 1),
        "plain": (EventStatus.PENDING.value, None, 0),
    }
    engine.dispose()


def test_the_batch_endpoint_stores_unsampled_as_skipped_and_gold_first(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = make_settings(tmp_path, store_url, redis_url, sample_rate=0.0)
    repeated = "the same words in the same order, passage after passage, again and again"
    body = {
        "events": [
            make_event("plain"),
            make_event("gold", gold_passage_ids=["d1"]),  # gold is always judged, first
            make_event("plain"),  # repeated in the batch
            make_event("looped", passages=[{"text": repeated}, {"text": repeated}]),
        ]
    }
    with TestClient(create_app(settings)) as client:
        answer = client.post("/v1/events/batch", json=body).json()
        statuses = {e: client.get(f"/v1/events/{e}").json()["status"] for e in ("plain", "gold")}
    assert [r["status"] for r in answer["results"]] == [
        "accepted",
        "accepted",
        "duplicate",
        "accepted",
    ]
    assert statuses == {"plain": "skipped", "gold": "pending"}
    engine = make_engine(store_url)
    with session_scope(engine) as session:
        rows = {
            row.event_id: (row.status, row.skip_reason, row.priority)
            for row in session.execute(select(Event)).scalars()
        }
    engine.dispose()
    assert rows == {
        "plain": ("skipped", "unsampled", 0),
        "gold": ("pending", None, 1),
        # Unsampled, so never judged: its duplicate signal does not make it urgent.
        "looped": ("skipped", "unsampled", 0),
    }


def test_a_sampled_event_with_repeating_passages_is_judged_first(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = make_settings(tmp_path, store_url, redis_url, sample_rate=1.0)
    repeated = "the same words in the same order, passage after passage, again and again"
    body = {
        "events": [
            make_event("plain"),
            make_event("looped", passages=[{"text": repeated}, {"text": repeated.upper()}]),
        ]
    }
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events/batch", json=body).json()["accepted"] == 2
    engine = make_engine(store_url)
    with session_scope(engine) as session:
        rows = {
            row.event_id: (row.status, row.priority)
            for row in session.execute(select(Event)).scalars()
        }
    engine.dispose()
    assert rows == {"plain": ("pending", 0), "looped": ("pending", 1)}


def _round_trips(store_url: str, session: Any, work: Any) -> list[str]:
    """What ``work()`` sends the database: on PostgreSQL one entry per round trip (the server's
    ReadyForQuery answers, read from libpq's protocol trace); on SQLite, which runs in the
    process, each statement's first words."""
    driver = session.connection().connection.driver_connection
    if not store_url.startswith("postgresql"):
        statements: list[str] = []
        driver.set_trace_callback(lambda sql: statements.append(" ".join(sql.split()[:3])))
        try:
            work()
        finally:
            driver.set_trace_callback(None)
        return statements
    import psycopg

    with tempfile.TemporaryFile("w+") as trace:
        driver.pgconn.trace(trace.fileno())
        driver.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            work()
        finally:
            driver.pgconn.untrace()
        trace.seek(0)
        return [line for line in trace.read().splitlines() if "\tReadyForQuery" in line]


@pytest.mark.parametrize("size", [5, 50])
def test_a_batch_costs_a_fixed_number_of_round_trips(store_url: str, size: int) -> None:
    """New events: their rows in one statement that also skips known ids (no lookup first),
    with their passages' references and texts on PostgreSQL, then in two statements on SQLite.
    Known ids add one lookup of their hashes."""
    engine = make_engine(store_url)
    batch = [(f"ev-{i}", _event(f"ev-{i}", n=4)) for i in range(size)]
    with session_scope(engine) as session:
        new = _round_trips(
            store_url, session, lambda: insert_events(session, "t1", batch, utcnow())
        )
        session.commit()
        again = _round_trips(
            store_url, session, lambda: insert_events(session, "t1", batch, utcnow())
        )
        session.commit()
    engine.dispose()
    if store_url.startswith("postgresql"):
        # BEGIN (the driver opens the transaction with its first statement), then the events
        # with their references and new texts in one statement.
        assert len(new) == 2
        assert len(again) == 3  # BEGIN, the statement skipping every row, the lookup of hashes
    else:
        event_inserts = [s for s in new if s == "INSERT INTO events"]
        assert event_inserts == ["INSERT INTO events"]
        assert not [s for s in new if s.startswith("SELECT")]
        on_events = [s.split()[0] for s in again if s.startswith(("INSERT INTO events", "SELECT"))]
        assert on_events == ["INSERT", "SELECT"]
