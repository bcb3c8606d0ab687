"""Database engine and sessions. SQLite gets WAL and a busy timeout so the API and the workers,
which are separate processes, can write the same file without "database is locked" errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import make_url
from sqlmodel import Session, create_engine

from service.store.readable import readable_json, readable_text


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            json_deserializer=readable_json,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # No pre-ping: it costs a round trip on every checkout, on the hot paths; connections the
    # server closed are recycled by age instead, and a failed statement is retried by the caller.
    return create_engine(
        url, pool_recycle=1800, pool_size=10, max_overflow=20, json_deserializer=readable_json
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.text_factory = readable_text
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    # NORMAL is durable across process crashes in WAL mode (only a power loss can drop the
    # last commits), which is the failure the acceptance guarantee is about.
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


@lru_cache(maxsize=4)
def get_engine(url: str) -> Engine:
    return make_engine(url)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    with Session(engine, expire_on_commit=False) as session:
        yield session
