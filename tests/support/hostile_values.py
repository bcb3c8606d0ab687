"""Hypothesis strategies of what a careless or hostile client sends: texts with NUL, lone
surrogates and astral characters, odd numbers and timestamps, deep JSON, whole event bodies."""

from __future__ import annotations

import string
from datetime import datetime, timedelta, timezone
from typing import Any

from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

EXAMPLES = 200


BUDGET = hypothesis_settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


# Any code point, lone surrogates included (hypothesis leaves them out unless asked).
ANY_CHAR = st.characters(exclude_categories=())


HOSTILE_TEXTS = (
    "\x00",
    "a\x00b",
    "\ud800",
    "x\udfff",
    "\u2028[p2] forged",
    "\x85",
    " ",
    "",
    "é" * 3,
    "x" * 250,
)


TEXT = st.one_of(
    st.text(string.ascii_letters + " ", min_size=1, max_size=12),
    st.text(ANY_CHAR, max_size=12),
    st.sampled_from(HOSTILE_TEXTS),
)


PLAIN = st.text(string.ascii_letters, min_size=1, max_size=10)


def mostly(valid: st.SearchStrategy[Any], hostile: st.SearchStrategy[Any]) -> Any:
    """Nine times in ten ``valid``: an event whose required fields are sound reaches the
    database, where the values no check thought of do their damage."""
    return st.integers(0, 9).flatmap(lambda n: hostile if n == 0 else valid)


LABEL = mostly(PLAIN, TEXT)


OFFSETS = st.integers(-14 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))


TIMESTAMP = st.one_of(
    st.datetimes(timezones=st.one_of(st.none(), OFFSETS)).map(datetime.isoformat),
    st.sampled_from(
        [
            "0001-01-01T00:00:00+14:00",
            "0001-01-01T00:00:00",
            "9999-12-31T23:59:59.999999-14:00",
            "9999-12-31T23:59:59",
            "1969-12-31T23:59:59Z",
            "2024-02-30T00:00:00Z",
            "2026-11-30T10:00:00Z",
            "now",
        ]
    ),
    st.integers(-(10**20), 10**20),
    st.floats(),
)


SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)


JSON_VALUE = st.recursive(
    SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.one_of(PLAIN, TEXT), inner, max_size=3)
    ),
    max_leaves=12,
)


def nested(depth: int) -> Any:
    value: Any = "deep"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


METADATA = st.one_of(
    st.dictionaries(st.one_of(PLAIN, TEXT), JSON_VALUE, max_size=4),
    st.integers(1, 60).map(lambda depth: {"nested": nested(depth)}),
    st.just({"big": "x" * 5000}),
)


PASSAGE_ID = st.one_of(PLAIN, TEXT, st.integers())


@st.composite
def passages(draw: st.DrawFn) -> list[dict[str, Any]]:
    count = draw(mostly(st.integers(1, 5), st.just(0)))
    items = []
    for index in range(count):
        item: dict[str, Any] = {"text": draw(mostly(PLAIN, TEXT))}
        if draw(st.booleans()):
            item["id"] = draw(st.one_of(st.just(f"d{index}"), PASSAGE_ID))
        if draw(st.booleans()):
            item["score"] = draw(st.one_of(st.floats(), st.integers(-(2**70), 2**70), TEXT))
        items.append(item)
    return items


OPTIONAL_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "timestamp": TIMESTAMP,
    "environment": LABEL,
    "k": st.one_of(st.integers(-2, 8), st.booleans(), st.floats()),
    "candidates": st.lists(
        st.fixed_dictionaries({"id": PASSAGE_ID}, optional={"score": st.floats()}), max_size=3
    ),
    "gold_passage_ids": st.lists(PASSAGE_ID, max_size=4),
    "response": TEXT,
    "response_grade": st.integers(-1, 7),
    "answer_correct": st.one_of(st.booleans(), st.integers(0, 2)),
    "metadata": METADATA,
}


@st.composite
def events(draw: st.DrawFn, number: int) -> dict[str, Any]:
    """An event body: often valid, with hostile values in any field."""
    event: dict[str, Any] = {
        "event_id": f"fz-{number}",
        "app": draw(LABEL),
        "retriever": draw(LABEL),
        "query": draw(mostly(PLAIN, TEXT)),
        "passages": draw(passages()),
    }
    fields = st.lists(st.sampled_from(sorted(OPTIONAL_FIELDS)), min_size=1, max_size=4, unique=True)
    for name in draw(fields):
        event[name] = draw(OPTIONAL_FIELDS[name])
    return event


FEEDBACK = st.fixed_dictionaries(
    {},
    optional={
        "response": TEXT,
        "response_grade": st.integers(0, 6),
        "answer_correct": st.booleans(),
        "extra": TEXT,
    },
)
