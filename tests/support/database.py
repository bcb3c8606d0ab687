"""Reading the database behind a test's app."""

from __future__ import annotations

from collections.abc import Callable

import redis
from sqlalchemy import Engine, create_engine, func, select, text

from service.config.settings import Settings
from service.telemetry.aggregates import DONE_PREFIX


def count_rows(settings: Settings, model: type) -> int:
    engine = create_engine(settings.database_url)
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(model)).scalar_one())


def db_scalar(settings: Settings, sql: str) -> int:
    engine = create_engine(settings.database_url)
    with engine.connect() as conn:
        value = int(conn.execute(text(sql)).scalar_one())
    engine.dispose()
    return value


def judged_and_exported(settings: Settings) -> int:
    """How many events are judged and exported to the shared aggregates.

    A worker commits an event's judged status, then exports it, setting a once-only marker in
    the same atomic step as the increments; a test reading the counters waits for both, or it
    would race the export on a loaded machine."""
    judged = db_scalar(settings, "SELECT count(*) FROM events WHERE status='judged'")
    client = redis.Redis.from_url(settings.redis_url)
    try:
        exported = sum(1 for _ in client.scan_iter(match=DONE_PREFIX + "*", count=1000))
    finally:
        client.close()
    return min(judged, exported)


def blocked_on_a_lock(engine: Engine, query_start: str) -> Callable[[], bool]:
    """Whether a statement starting with ``query_start`` waits on a lock in this PostgreSQL
    database: what a test holding a transaction open waits to see before it lets go."""

    def blocked() -> bool:
        with engine.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND query LIKE :q"
                ),
                {"q": f"{query_start}%"},
            ).scalar_one()
        return bool(waiting)

    return blocked
