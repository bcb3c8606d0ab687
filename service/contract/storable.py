"""What every supported store can keep, decided in one place before anything is stored.

A value that passes validation must never be refused by the database afterwards: such a refusal
used to surface as a 503 with Retry-After (so a client retried forever) or failed a whole batch.
The bodies' models (``service/contract/schemas.py``) run ``check_body`` over the raw body, every key
and value at every depth, so a field added later is covered without a rule of its own:

- text: no NUL (PostgreSQL refuses it in text and JSON) and no lone surrogate (not UTF-8, so no
  driver can encode it, and a JSON answer carrying one cannot be written);
- numbers: finite (JSON has no NaN or Infinity; PostgreSQL's json type refuses them) and integers
  within 64 bits (the widest column type);
- nesting: at most ``MAX_NESTING`` levels (serializers recurse; deeper bodies overflow them);
- moments: with a timezone, and within ``EARLIEST``..``LATEST``, which both stores and every
  datetime computation on them (chart bins, windows) handle.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import UTC, datetime

MAX_NESTING = 32
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
_INT64 = 2**63


class NotStorableError(ValueError):
    """A value no store can keep; the message names where it is and why."""


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text, or None when it can."""
    if "\x00" in value:
        return "contains a NUL character"
    if value.isascii():  # no surrogate possible; spares encoding a copy of every text
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode (lone surrogate)"
    return None


def check_text(value: str, where: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise NotStorableError(f"{where} {problem}")
    return value


def _child(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def check_body(value: object, where: str = "", depth: int = 0) -> None:
    """Raise NotStorableError for the first key or value at any depth no store can keep."""
    # Every body is walked on ingest; nearly all pass. The quick walk builds no path names and
    # makes no call per string; the walk below, which names where the problem is, runs only
    # when the quick one finds one (or meets a type it leaves to it).
    if not _plainly_storable(value, depth):
        _check_body(value, where, depth)


def _plainly_storable(value: object, depth: int) -> bool:
    """True when ``_check_body`` would pass ``value``; False when it may not."""
    if depth > MAX_NESTING:
        return False
    children: Iterable[object]
    if type(value) is str:
        return text_problem(value) is None
    if type(value) is dict:
        if not all(type(key) is str and text_problem(key) is None for key in value):
            return False
        children = value.values()
    elif type(value) is list:
        children = value
    else:
        return _plain_scalar(value)
    if value and depth + 1 > MAX_NESTING:
        return False
    for child in children:
        if type(child) is str:
            if text_problem(child) is not None:
                return False
        elif type(child) is dict or type(child) is list:
            if not _plainly_storable(child, depth + 1):
                return False
        elif not _plain_scalar(child):
            return False
    return True


def _plain_scalar(value: object) -> bool:
    if value is None or type(value) is bool:
        return True
    if type(value) is int:
        return -_INT64 <= value < _INT64
    if type(value) is float:
        return math.isfinite(value)
    return False


def _check_body(value: object, where: str = "", depth: int = 0) -> None:
    if depth > MAX_NESTING:
        raise NotStorableError(
            f"{where or 'the body'} is nested more than {MAX_NESTING} levels deep"
        )
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int):
        if not -_INT64 <= value < _INT64:
            raise NotStorableError(f"{where} is an integer outside 64 bits")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise NotStorableError(
                f"{where} holds {value!r}, which JSON cannot carry; send null instead"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            name = str(key)
            if isinstance(key, str):
                check_text(key, f"the key {key[:40]!a} of {where or 'the body'}")
            _check_body(item, _child(where, name[:40]), depth + 1)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_body(item, f"{where}[{index}]", depth + 1)


def nesting_depth(value: object) -> int:
    """How many levels of objects and arrays ``value`` holds (0 for a scalar)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            stack.extend((child, depth + 1) for child in item.values())
            deepest = max(deepest, depth + 1)
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1) for child in item)
            deepest = max(deepest, depth + 1)
    return deepest


def check_moment(value: datetime, where: str) -> datetime:
    """The moment in UTC; refused without a timezone or outside EARLIEST..LATEST."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise NotStorableError(
            f"{where} has no timezone: add Z or an offset such as +02:00 (it would be ambiguous)"
        )
    try:
        moment = value.astimezone(UTC)
    except OverflowError:
        moment = None
    if moment is None or not EARLIEST <= moment < LATEST:
        raise NotStorableError(
            f"{where} must be from {EARLIEST.date()} up to {LATEST.date()} (UTC), got {value}"
        )
    return moment
