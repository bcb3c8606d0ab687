"""What goes over the wire: the v1 event and feedback JSON, and how long a refusal asks to wait.

Everything here runs on the sender thread, never in the caller's ``record()``: turning the
caller's objects into JSON is the expensive part, and it is what the queue defers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote

PASSAGE_FIELDS = ("id", "text", "score")


class UnsendableError(ValueError):
    """The event cannot be turned into JSON the monitor would take; it is reported, not sent."""


class EventRecord:
    """One retrieval as ``record()`` took it: the caller's own objects, not yet copied."""

    __slots__ = (
        "app",
        "environment",
        "event_id",
        "gold_passage_ids",
        "k",
        "metadata",
        "passages",
        "query",
        "response",
        "retriever",
        "timestamp",
    )

    def __init__(
        self,
        event_id: str,
        timestamp: float | datetime | None,
        app: str,
        retriever: str,
        environment: str | None,
        query: str,
        passages: Sequence[str | Mapping[str, Any]],
        k: int | None,
        gold_passage_ids: Sequence[str] | None,
        metadata: Mapping[str, Any] | None,
        response: str | None,
    ) -> None:
        self.event_id = event_id
        self.timestamp = timestamp
        self.app = app
        self.retriever = retriever
        self.environment = environment
        self.query = query
        self.passages = passages
        self.k = k
        self.gold_passage_ids = gold_passage_ids
        self.metadata = metadata
        self.response = response


class FeedbackRecord:
    """The answer's grade and/or correctness, sent to the event's feedback route."""

    __slots__ = ("body", "event_id")

    def __init__(self, event_id: str, body: dict[str, Any]) -> None:
        self.event_id = event_id
        self.body = body


def event_json(event: EventRecord) -> bytes:
    """The event as the monitor's ``POST /v1/events`` takes it, compact UTF-8 JSON.

    Raises ``UnsendableError`` and nothing else, whatever the caller handed to ``record()``: the
    sender rejects that one event and sends the rest of its batch.
    """
    try:
        return dumps(_event_body(event))
    except UnsendableError:
        raise
    except Exception as exc:  # the caller's objects run their own code here (len, iter, getitem)
        raise UnsendableError(f"cannot be read: {exc.__class__.__name__}: {exc}"[:300]) from exc


def feedback_request(feedback: FeedbackRecord) -> tuple[str, bytes]:
    """The path and body of the feedback's request; ``UnsendableError`` if it has none."""
    try:
        path = f"/v1/events/{quote(feedback.event_id, safe='')}/feedback"
    except Exception as exc:
        raise UnsendableError(f"the event id cannot be sent: {exc}"[:300]) from exc
    return path, dumps(feedback.body)


def _event_body(event: EventRecord) -> dict[str, Any]:
    body: dict[str, Any] = {
        "event_id": event.event_id,
        "app": event.app,
        "retriever": event.retriever,
        "query": event.query,
        "passages": [
            _passage(rank, p)
            for rank, p in enumerate(_sequence("passages", event.passages), start=1)
        ],
    }
    if event.timestamp is not None:
        body["timestamp"] = _iso(event.timestamp)
    optional = {
        "environment": event.environment,
        "k": event.k,
        "gold_passage_ids": None
        if event.gold_passage_ids is None
        else list(_sequence("gold_passage_ids", event.gold_passage_ids)),
        "metadata": None if event.metadata is None else dict(event.metadata),
        "response": event.response,
    }
    body.update((name, value) for name, value in optional.items() if value is not None)
    return body


def dumps(body: Mapping[str, Any]) -> bytes:
    try:
        # NaN and Infinity are not JSON; the monitor would refuse them, so they are caught here.
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise UnsendableError(f"not JSON-serialisable: {exc}"[:300]) from exc
    except RecursionError as exc:
        raise UnsendableError("not JSON-serialisable: nested too deeply") from exc
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise UnsendableError(f"not UTF-8: {exc.reason} at {exc.start}") from exc


def batch_body(events: Sequence[bytes]) -> bytes:
    """``{"events": [...]}`` from events already serialised one by one."""
    return b'{"events":[' + b",".join(events) + b"]}"


def retry_after_seconds(value: str | None, cap: float) -> float | None:
    """Seconds from a Retry-After header (a delay or an HTTP date), within [0, cap]."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), cap)


def _passage(rank: int, passage: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(passage, str):
        return {"text": passage}
    if isinstance(passage, Mapping):
        return {name: passage[name] for name in PASSAGE_FIELDS if passage.get(name) is not None}
    raise UnsendableError(
        f"passage {rank} is a {type(passage).__name__}: give a str or a mapping with 'text'"
    )


def _sequence(name: str, values: Iterable[Any]) -> Iterable[Any]:
    # A lone string is iterable too, by character: each would become a passage or an id.
    if isinstance(values, str | bytes):
        raise UnsendableError(f"{name} is a {type(values).__name__}: give a list")
    return values


def _iso(timestamp: float | datetime) -> str:
    if isinstance(timestamp, datetime):
        moment = timestamp if timestamp.tzinfo is not None else timestamp.replace(tzinfo=UTC)
        return moment.isoformat()
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float):
        kind = type(timestamp).__name__
        raise UnsendableError(f"timestamp is a {kind}: give a datetime or seconds")
    try:
        return datetime.fromtimestamp(timestamp, UTC).isoformat()
    except (ValueError, OverflowError, OSError) as exc:
        raise UnsendableError(f"timestamp {timestamp!r} is not a time: {exc}") from exc
