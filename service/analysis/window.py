"""Time windows as people type them: ISO 8601 moments or spans back from now ("24h", "7d")."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

DEFAULT_SPAN = timedelta(days=7)
_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_span(text: str) -> timedelta | None:
    """ "90m", "24h", "7d", "2w" as a timedelta; None when ``text`` is not such a span."""
    match = _RELATIVE.match(text)
    if match is None:
        return None
    return timedelta(**{_UNITS[match.group(2).lower()]: float(match.group(1))})


def parse_moment(text: str, now: datetime) -> datetime:
    """ "now", a span back from ``now`` ("24h": 24 hours ago), or an ISO 8601 moment (UTC when
    it names no offset). Raises ValueError on anything else."""
    if text.strip().lower() == "now":
        return now
    span = parse_span(text)
    if span is not None:
        return now - span
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a time: {text!r} (use ISO 8601, e.g. 2025-01-31T12:00Z, or a span such as "
            "24h, 7d, 2w)"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def resolve_window(
    since: str | None, until: str | None, now: datetime, default_span: timedelta = DEFAULT_SPAN
) -> tuple[datetime, datetime]:
    """[since, until): until defaults to now, since to ``default_span`` before until."""
    end = parse_moment(until, now) if until else now
    start = parse_moment(since, now) if since else end - default_span
    if start >= end:
        raise ValueError(
            f"the window is empty: since {start.isoformat()} >= until {end.isoformat()}"
        )
    return start, end


def preceding(since: datetime, until: datetime) -> tuple[datetime, datetime]:
    """The window of the same length just before [since, until): the baseline of a comparison."""
    return since - (until - since), since
