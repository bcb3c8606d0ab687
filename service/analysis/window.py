"""Time windows as people type them: ISO 8601 moments or spans back from now ("24h", "7d")."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from service.primitives.clock import as_utc

DEFAULT_SPAN = timedelta(days=7)
# What parse_moment accepts, for the --since and --until of every command.
TIME_HELP = "ISO 8601 (UTC unless an offset is given) or a span back from now: 90m, 24h, 7d, 2w"
_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
# Windows begin no earlier than this and end no later than a day past now: far enough for any
# real traffic, and near enough that a window, its baseline before it, and every date the
# databases store stay inside the calendar (a year-1 moment minus a week is not a date).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_AHEAD = timedelta(days=1)


def parse_span(text: str) -> timedelta | None:
    """ "90m", "24h", "7d", "2w" as a timedelta; None when ``text`` is not such a span."""
    match = _RELATIVE.match(text)
    if match is None:
        return None
    try:
        return timedelta(**{_UNITS[match.group(2).lower()]: float(match.group(1))})
    except OverflowError:
        raise ValueError(f"span {text.strip()!r} is longer than any window") from None


def parse_moment(text: str, now: datetime) -> datetime:
    """ "now", a span back from ``now`` ("24h": 24 hours ago), or an ISO 8601 moment (UTC when
    it names no offset). Raises ValueError on anything else."""
    if text.strip().lower() == "now":
        return now
    span = parse_span(text)
    if span is not None:
        if span > now - EARLIEST:
            raise ValueError(f"span {text.strip()!r} reaches before {EARLIEST:%Y-%m-%d}")
        return now - span
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        moment = as_utc(moment)
    except (ValueError, OverflowError):
        raise ValueError(
            f"not a time: {text!r} (use ISO 8601, e.g. 2025-01-31T12:00Z, or a span such as "
            "24h, 7d, 2w)"
        ) from None
    if not EARLIEST <= moment <= now + LATEST_AHEAD:
        raise ValueError(
            f"{text!r} is outside the windows the analysis reads ({EARLIEST:%Y-%m-%d} to a day "
            "from now)"
        )
    return moment


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
