"""The JSON the client sends, built on the sender thread from what ``record()`` took."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from retrieval_monitor_client.wire import (
    EventRecord,
    UnsendableError,
    batch_body,
    event_json,
    retry_after_seconds,
)

from service.contract.schemas import BatchIn, EventIn


def record(**changes: object) -> EventRecord:
    fields: dict[str, object] = {
        "event_id": "abc-1",
        "timestamp": 0.0,
        "app": "shop",
        "retriever": "bm25",
        "environment": None,
        "query": "red shoes",
        "passages": ["Red shoes, size 42", {"id": "d2", "text": "Blue shoes", "score": 0.5}],
        "k": 1,
        "gold_passage_ids": ("d2",),
        "metadata": {"user_tier": "gold"},
        "response": None,
    }
    fields.update(changes)
    return EventRecord(**fields)  # type: ignore[arg-type]


def test_an_event_is_what_the_service_schema_accepts() -> None:
    body = json.loads(event_json(record()))
    assert body == {
        "event_id": "abc-1",
        "timestamp": "1970-01-01T00:00:00+00:00",
        "app": "shop",
        "retriever": "bm25",
        "query": "red shoes",
        "passages": [
            {"text": "Red shoes, size 42"},
            {"id": "d2", "text": "Blue shoes", "score": 0.5},
        ],
        "k": 1,
        "gold_passage_ids": ["d2"],
        "metadata": {"user_tier": "gold"},
    }
    parsed = EventIn.model_validate(body)
    assert parsed.timestamp == datetime(1970, 1, 1, tzinfo=UTC)
    batch = BatchIn.model_validate_json(batch_body([event_json(record()), event_json(record())]))
    assert len(batch.events) == 2


def test_no_timestamp_lets_the_service_stamp_arrival_and_naive_datetimes_are_utc() -> None:
    assert "timestamp" not in json.loads(event_json(record(timestamp=None)))
    naive = json.loads(event_json(record(timestamp=datetime(2026, 1, 2, 3, 4, 5))))
    assert naive["timestamp"] == "2026-01-02T03:04:05+00:00"


@pytest.mark.parametrize(
    ("changes", "says"),
    [
        ({"metadata": {"when": datetime(2026, 1, 1)}}, "not JSON-serialisable"),
        ({"passages": [{"text": "x", "score": float("nan")}]}, "not JSON-serialisable"),
        ({"passages": ["fine", 42]}, "passage 2 is a int"),
    ],
)
def test_what_cannot_be_sent_says_why(changes: dict[str, object], says: str) -> None:
    with pytest.raises(UnsendableError, match=says):
        event_json(record(**changes))


def test_retry_after_reads_seconds_and_http_dates_within_the_cap() -> None:
    assert retry_after_seconds("3", cap=30) == 3.0
    assert retry_after_seconds(None, cap=30) is None
    assert retry_after_seconds("soon", cap=30) is None
    assert retry_after_seconds("100000", cap=30) == 30.0
    past = format_datetime(datetime(2000, 1, 1).astimezone(), usegmt=False)
    assert retry_after_seconds(past, cap=30) == 0.0
