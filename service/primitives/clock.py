"""The one clock and the one UTC normaliser: every stored moment is UTC."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload


def utcnow() -> datetime:
    return datetime.now(UTC)


@overload
def as_utc(moment: datetime) -> datetime: ...


@overload
def as_utc(moment: None) -> None: ...


def as_utc(moment: datetime | None) -> datetime | None:
    """The same moment in UTC. A naive value is taken as UTC already: SQLite hands datetimes back
    naive, and they were written as UTC. An offset that carries the moment past year 1 or 9999
    clamps to the representable end."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    try:
        return moment.astimezone(UTC)
    except OverflowError:
        edge = datetime.min if moment.year < 5000 else datetime.max
        return edge.replace(tzinfo=UTC)
