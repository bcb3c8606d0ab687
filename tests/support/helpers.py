"""Event builders, and the judging and keys the page tests need, shared by the tests."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from sqlalchemy import Engine

from service.api.app import create_app
from service.auth.keys import key_hash, new_key
from service.cli.gold import add_gold_command
from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.measures.formulas import EventLabels, compute_measures
from service.primitives.clock import utcnow
from service.primitives.hashing import text_hash
from service.store import events as event_store
from service.store import judging as judging_store
from service.store.engine import make_engine, session_scope
from service.store.events import insert_events
from service.store.keys import add_key
from service.store.migrate import upgrade
from service.ui.routes import router as ui_router
from service.wiring.runtime import Runtime


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


def ui_app(settings: Settings) -> FastAPI:
    """The service's app with the pages, whether or not create_app already includes them."""
    app = create_app(settings)
    if not any(getattr(route, "path", "").startswith("/ui") for route in app.routes):
        app.include_router(ui_router)
    return app


def judge(
    engine: Engine,
    event_id: str,
    grades: Sequence[int],
    *,
    context: int | None = 2,
    tenant: str = "default",
    judge_name: str = "test-judge",
    prompt_version: str = "v1",
) -> dict[str, float | None]:
    """Store a judging of the event with these grades, as a worker would."""
    with session_scope(engine) as session:
        found = event_store.find_event(session, tenant, event_id)
        assert found is not None
        assert found.id is not None
        event = judging_store.load_for_judging(session, found.id)
        assert event is not None
        gold = set(event.gold_passage_ids or [])
        labels = EventLabels(
            grades=list(grades),
            k=event.k,
            context_rating=context,
            gold_relevant=[p.passage_id in gold for p in event.passages] if gold else None,
            n_gold=len(gold) if gold else None,
        )
        measures = compute_measures(labels, 0.5)
        result = judging_store.JudgingResult(
            grades=list(grades),
            from_cache=[False] * len(grades),
            context_rating=context,
            calls=1,
            prompt_tokens=10,
            completion_tokens=5,
            malformed_replies=0,
            new_cache_entries={},
            query_hash=text_hash(event.query),
            measures=measures,
            np_window=int(measures["np_window"] or 0),
            alpha=0.5,
            threshold=2,
        )
        who = judging_store.JudgeIdentity(judge_name, "test-model", prompt_version)
        assert judging_store.store_judging(session, event, who, result)
        session.commit()
    return measures


def make_key(settings: Settings, tenant: str) -> str:
    key = new_key()
    engine = make_engine(settings.database_url)
    with session_scope(engine) as session:
        add_key(session, tenant, key_hash(key), "ui test", False, datetime.now(UTC))
        session.commit()
    engine.dispose()
    return key


def bearer(key: str) -> dict[str, str]:
    """The header that presents an API key."""
    return {"Authorization": f"Bearer {key}"}


def gold_export(settings: Settings, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_gold_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["gold", "export", *argv])
    result: int = args.handler(args, settings)
    return result
