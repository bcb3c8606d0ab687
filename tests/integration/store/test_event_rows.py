"""Event rows sent to the driver are stored exactly as an ORM insert of the same row stores them.

``service/store/event_rows.py`` writes tuples with each column's bind processor; SQLAlchemy's own
``insert(table)`` of the same row is the reference. Both are written into one database under two
tenants and every written column is compared as the database holds it (SQLite's stored text,
PostgreSQL's text form of each value), for hand-picked edge cases and for the bodies the
hostile-input property test draws.

Tests ``service.store.driver``.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given
from hypothesis import settings as hypothesis_settings
from pydantic import ValidationError
from sqlalchemy import Engine, make_url
from sqlalchemy import text as sql_text
from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError

from service.contract.schemas import EventIn
from service.store.binary_arrays import arrays_usable
from service.store.engine import make_engine, session_scope
from service.store.event_rows import COLUMNS, insert_new_events
from service.store.events import InitialState, _new_row, payload_hash
from service.store.models import Event, table
from tests.support.helpers import make_event
from tests.support.hostile_values import events as hostile_events

_NUMBERS = itertools.count()


def _stored(engine: Engine, tenant: str, event_id: str) -> tuple[Any, ...]:
    """Each written column but the tenant as the database keeps it, in its text form."""
    postgres = engine.dialect.name == "postgresql"
    shown = ", ".join(f"{name}::text" if postgres else name for name in COLUMNS[1:])
    with engine.connect() as connection:
        driver: Any = connection.connection.driver_connection
        cursor = driver.cursor()
        try:
            mark = "%s" if postgres else "?"
            cursor.execute(
                f"SELECT {shown} FROM events WHERE tenant = {mark} AND event_id = {mark}",
                (tenant, event_id),
            )
            row = cursor.fetchone()
        finally:
            cursor.close()
    assert row is not None, f"{tenant}/{event_id} was not stored"
    return tuple(row)


def _written_both_ways(engine: Engine, event: EventIn, state: InitialState | None) -> None:
    event_id = f"row-{next(_NUMBERS)}"
    now = datetime.now(UTC)
    initial = {event_id: state} if state else None
    rows = {
        tenant: _new_row(tenant, event_id, event, now, payload_hash(event), initial)
        for tenant in ("orm", "driver")
    }
    with session_scope(engine) as session:
        session.execute(table(Event).insert(), [{name: rows["orm"][name] for name in COLUMNS}])
        keys, _ = insert_new_events(session, "driver", [rows["driver"]])
        assert list(keys) == [event_id]
        # A known id is skipped, not an error, and does not come back.
        assert insert_new_events(session, "driver", [rows["driver"]])[0] == {}
        session.commit()
    assert _stored(engine, "driver", event_id) == _stored(engine, "orm", event_id)


MARQUESAS = timezone(timedelta(hours=-9, minutes=-30))
EDGE_CASES = [
    (make_event("plain"), None),
    (
        make_event(
            "full",
            timestamp=datetime(
                2026, 3, 1, 23, 30, tzinfo=timezone(timedelta(hours=-9, minutes=-30))
            ),
            environment="prod",
            candidates=[{"id": "c1", "score": 0.5}, {"id": "c2"}],
            gold_passage_ids=["p1", "é"],
            response="an answer with 'quotes' and \\ and \u2028",
            response_grade=5,
            answer_correct=False,
            metadata={"nested": {"list": [1, 2.5, None, True]}, "ünï": "\U0001f600"},
        ),
        InitialState(skip_reason="unsampled"),
    ),
    (make_event("urgent", gold_passage_ids=["d1"], answer_correct=True), InitialState(priority=1)),
]


@pytest.mark.parametrize(("body", "state"), EDGE_CASES, ids=["plain", "full", "urgent"])
def test_edge_cases_are_stored_as_the_orm_stores_them(
    store_url: str, body: dict[str, Any], state: InitialState | None
) -> None:
    engine = make_engine(store_url)
    try:
        _written_both_ways(engine, EventIn.model_validate(body), state)
    finally:
        engine.dispose()


@hypothesis_settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
    ],
)
@given(body=hostile_events(0))
def test_drawn_events_are_stored_as_the_orm_stores_them(
    store_url: str, body: dict[str, Any]
) -> None:
    try:
        event = EventIn.model_validate(body)
    except ValidationError:
        event = None
    assume(event is not None)  # a body refused before the store is not this test's subject
    assert event is not None
    engine = make_engine(store_url)
    try:
        _written_both_ways(engine, event, None)
    finally:
        engine.dispose()


def test_a_driver_error_is_raised_as_sqlalchemy_raises_it(store_url: str) -> None:
    """Callers tell an unavailable database from a refused value by SQLAlchemy's classes."""
    engine = make_engine(store_url)
    event = EventIn.model_validate(make_event("gone"))
    row = _new_row("t", "gone", event, datetime.now(UTC), payload_hash(event), None)
    try:
        with session_scope(engine) as session:
            # Undone by the rollback: DDL is transactional on both stores.
            session.execute(sql_text("ALTER TABLE events RENAME TO events_away"))
            with pytest.raises(DBAPIError) as raised:
                insert_new_events(session, "t", [row])
            session.rollback()
    finally:
        engine.dispose()
    # No such table: OperationalError from sqlite3, ProgrammingError from psycopg, as
    # SQLAlchemy itself raises them; the driver's own error is kept as ``orig``.
    expected = ProgrammingError if store_url.startswith("postgresql") else OperationalError
    assert isinstance(raised.value, expected)
    assert "events" in str(raised.value.orig)


def test_a_connection_not_speaking_utf8_sends_the_lists_psycopg_dumps(postgres_url: str) -> None:
    # The arrays are encoded ahead only for a UTF-8 client; a database URL may set another
    # client encoding, and then psycopg encodes the texts as that connection speaks.
    url = make_url(postgres_url).update_query_dict({"options": "-c client_encoding=LATIN1"})
    engine = make_engine(url.render_as_string(hide_password=False))
    try:
        with engine.connect() as connection:
            driver: Any = connection.connection.driver_connection
            assert not arrays_usable(driver)
        for body, state in (EDGE_CASES[0], EDGE_CASES[2]):
            _written_both_ways(engine, EventIn.model_validate(body), state)
        latin = make_event("latin", query="où est-ce ?", response="déjà")
        _written_both_ways(engine, EventIn.model_validate(latin), None)
    finally:
        engine.dispose()
    engine = make_engine(postgres_url)
    try:
        with engine.connect() as connection:
            driver = connection.connection.driver_connection
            assert arrays_usable(driver)
    finally:
        engine.dispose()
