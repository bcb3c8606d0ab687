"""Statements sent to the driver directly, failing as if SQLAlchemy had sent them.

The bulk writes of ingest go to the driver (plain tuples, COPY): SQLAlchemy's per-row work cost
more than the database's own. Their errors must still look like SQLAlchemy's, because callers
decide by those classes: an unavailable database (``OperationalError``) answers a whole group
503 at once, a refused value (``DataError``) fails its event alone, a unique-key race
(``IntegrityError``) is retried. A connection the driver lost is invalidated, as SQLAlchemy would,
so the pool does not hand it out again.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError


@contextmanager
def driver_errors(connection: Connection, statement: str) -> Iterator[None]:
    """Raise the driver's errors within as the SQLAlchemy exceptions they map to."""
    dbapi = connection.dialect.loaded_dbapi
    try:
        yield
    except dbapi.Error as exc:
        invalidated = connection.dialect.is_disconnect(exc, connection.connection, None)
        if invalidated:
            connection.invalidate(exc)
        raise DBAPIError.instance(
            statement,
            None,
            exc,
            dbapi.Error,
            hide_parameters=True,
            connection_invalidated=invalidated,
            dialect=connection.dialect,
        ) from exc
