"""What the pages are asked to show: a time window and the event filters, read leniently from the
query string (a page answers a bad filter with a message, not an error page)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Literal
from urllib.parse import urlencode

from service.measures.catalogue import MEASURE_NAMES
from service.store.models import MissCauseKind
from service.store.pages import UNCLASSIFIED

WINDOWS: dict[str, timedelta | None] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "all": None,
}
DEFAULT_WINDOW = "7d"

Outcome = Literal["hit", "miss"]


@dataclass(frozen=True)
class TimeWindow:
    """Events received in [since, until); None leaves that side open."""

    name: str
    since: datetime | None
    until: datetime | None


def time_window(name: str | None, now: datetime) -> TimeWindow:
    chosen = name if name in WINDOWS else DEFAULT_WINDOW
    span = WINDOWS[chosen]
    return TimeWindow(chosen, None if span is None else now - span, None)


@dataclass(frozen=True)
class EventFilter:
    window: TimeWindow
    app: str | None = None
    retriever: str | None = None
    measure: str | None = None
    below: float | None = None
    outcome: Outcome | None = None
    gold: bool | None = None
    cause: str | None = None
    """A MissCauseKind value or ``unclassified``; only the misses pages use it."""
    page: int = 1
    errors: tuple[str, ...] = field(default=())

    def query_string(self, *, window: str | None = None, **changes: object) -> str:
        """The query string that reproduces this filter, with some fields changed."""
        current = replace(self, **changes)  # type: ignore[arg-type]
        params: dict[str, str] = {"window": window or current.window.name}
        for name in ("app", "retriever", "measure", "outcome", "cause"):
            value = getattr(current, name)
            if value:
                params[name] = str(value)
        if current.below is not None and current.measure:
            params["below"] = f"{current.below:g}"
        if current.gold is not None:
            params["gold"] = "yes" if current.gold else "no"
        if current.page > 1:
            params["page"] = str(current.page)
        return urlencode(params)


def parse_filter(params: Mapping[str, str], now: datetime | None = None) -> EventFilter:
    errors: list[str] = []
    window = time_window(params.get("window"), now or datetime.now(UTC))

    def text(name: str) -> str | None:
        value = params.get(name, "").strip()
        return value or None

    measure = text("measure")
    if measure is not None and measure not in MEASURE_NAMES:
        errors.append(f"unknown measure {measure!r}")
        measure = None
    below: float | None = None
    raw_below = text("below")
    if raw_below is not None:
        try:
            below = float(raw_below)
        except ValueError:
            errors.append(f"threshold {raw_below!r} is not a number")
        else:
            if not math.isfinite(below):
                errors.append("the threshold must be a finite number")
                below = None
    if below is not None and measure is None:
        errors.append("a threshold needs a measure")
        below = None
    outcome_text = text("outcome")
    outcome: Outcome | None = None
    if outcome_text == "hit":
        outcome = "hit"
    elif outcome_text == "miss":
        outcome = "miss"
    elif outcome_text is not None:
        errors.append(f"outcome must be hit or miss, not {outcome_text!r}")
    gold_text = text("gold")
    gold = {"yes": True, "no": False}.get(gold_text or "")
    if gold_text is not None and gold is None:
        errors.append(f"gold must be yes or no, not {gold_text!r}")
    cause = text("cause")
    if cause is not None and cause != UNCLASSIFIED and cause not in set(MissCauseKind):
        errors.append(f"unknown cause {cause!r}")
        cause = None
    page_text = text("page") or "1"
    page = int(page_text) if page_text.isdigit() and int(page_text) >= 1 else 1
    return EventFilter(
        window=window,
        app=text("app"),
        retriever=text("retriever"),
        measure=measure,
        below=below,
        outcome=outcome,
        gold=gold,
        cause=cause,
        page=page,
        errors=tuple(errors),
    )
