"""Event builders shared by the tests."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from service.runtime import Runtime
from service.schemas import EventIn
from service.settings import Settings
from service.store.engine import session_scope
from service.store.events import insert_events, utcnow
from service.store.migrate import upgrade


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


def store_event(
    settings: Settings, event_id: str, query: str, texts: Sequence[str], k: int
) -> tuple[Runtime, int]:
    """Migrate, open the shared aggregates as the API does at start, and store one event directly;
    the runtime and the event's primary key, for tests that judge it in-process."""
    upgrade(settings.database_url)
    runtime = Runtime(settings)
    runtime.aggregates.start_epoch(time.time())
    event = EventIn.model_validate(
        {
            "app": "shop",
            "retriever": "bm25",
            "query": query,
            "k": k,
            "passages": [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)],
        }
    )
    with session_scope(runtime.engine) as session:
        (inserted,) = insert_events(session, "default", [(event_id, event)], utcnow())
        session.commit()
    assert inserted.pk is not None
    return runtime, inserted.pk
