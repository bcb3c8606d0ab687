"""Event builders shared by the tests."""

from __future__ import annotations

from typing import Any


def make_event(
    event_id: str | None = "ev-1",
    n: int = 4,
    k: int | None = None,
    query: str = "what is the boiling point of water",
    app: str = "shop",
    retriever: str = "bm25-v1",
    **extra: Any,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "app": app,
        "retriever": retriever,
        "query": query,
        "passages": [
            {"id": f"d{i}", "text": f"passage number {i} about topic {i}", "score": 10.0 - i}
            for i in range(1, n + 1)
        ],
    }
    if event_id is not None:
        event["event_id"] = event_id
    if k is not None:
        event["k"] = k
    event.update(extra)
    return event
