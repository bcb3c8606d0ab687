"""Events nothing will judge stored narrow (RM_KEEP_TEXTS=needed), on SQLite and PostgreSQL.

A narrow row keeps what identifies and counts the event and none of its texts. What must hold:
the events that something reads (judged, gold, looking bad, the kept share) keep everything; a
narrow event still answers a resend (200) and a changed body (409); feedback on it is stored and
counted; every counter of /metrics is the same as with every event kept; re-judging, the
labelling queue and the workers leave narrow rows out, and the first two say how many.

Tests ``service.analysis.gold_queue``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select
from sqlmodel import col

from service.analysis.gold_queue import queue_state
from service.api.app import create_app
from service.config.settings import Settings
from service.ingest.sampling import keep_point
from service.primitives.clock import utcnow
from service.store import spend as spend_store
from service.store.analysis import EventWindow
from service.store.engine import make_engine, session_scope
from service.store.judging import load_many_for_judging
from service.store.models import Event, Passage, PassageText
from service.store.partitions import schema_tables
from tests.support.environment import make_settings
from tests.support.helpers import judge, make_event, ui_app
from tests.support.routes import every_route

REPEATED = "the same words in the same order, passage after passage, again and again"


def _rows(settings: Settings) -> dict[str, Event]:
    engine = make_engine(settings.database_url)
    with session_scope(engine) as session:
        rows = {row.event_id: row for row in session.execute(select(Event)).scalars()}
        for row in rows.values():
            session.expunge(row)
    engine.dispose()
    return rows


def _passage_rows(settings: Settings) -> dict[int, int]:
    engine = make_engine(settings.database_url)
    with session_scope(engine) as session:
        counts = dict(
            session.execute(
                select(col(Passage.event_pk), func.count()).group_by(col(Passage.event_pk))
            ).all()
        )
    engine.dispose()
    return {int(pk): int(n) for pk, n in counts.items()}


def _narrow_settings(tmp_path: Path, store_url: str, redis_url: str, **extra: Any) -> Settings:
    values: dict[str, Any] = {"sample_rate": 0.0, "keep_texts": "needed", "keep_texts_share": 0.0}
    values.update(extra)
    return make_settings(tmp_path, store_url, redis_url, **values)


def _mixed_batch() -> list[dict[str, Any]]:
    return [
        make_event(
            "plain",
            candidates=[{"id": "c1", "score": 0.5}],
            response="an answer",
            metadata={"user": "u1"},
        ),
        make_event("gold", gold_passage_ids=["d1"]),  # gold is always judged
        # Passages that repeat each other: it looks bad, so a person may open it.
        make_event(
            "looped",
            query="why do the passages repeat",
            passages=[{"text": REPEATED}, {"text": REPEATED.upper()}],
        ),
    ]


def test_only_events_nothing_reads_are_stored_narrow(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = _narrow_settings(tmp_path, store_url, redis_url)
    with TestClient(ui_app(settings)) as client:
        answer = client.post("/v1/events/batch", json={"events": _mixed_batch()})
        assert answer.status_code == 200, answer.text
        assert answer.json()["accepted"] == 3
        view = client.get("/v1/events/plain").json()
        kept_view = client.get("/v1/events/gold").json()
        narrow_page = client.get("/ui/events/plain")
        kept_page = client.get("/ui/events/gold")
    rows = _rows(settings)
    passages = _passage_rows(settings)
    sent = {event["event_id"]: event for event in _mixed_batch()}
    plain = rows["plain"]
    assert plain.texts_kept is False
    assert (plain.query, plain.candidates, plain.response, plain.event_metadata) == (
        "",
        None,
        None,
        None,
    )
    # What identifies and counts it stays.
    assert (plain.status, plain.skip_reason, plain.k, plain.passage_count) == (
        "skipped",
        "unsampled",
        4,
        4,
    )
    assert (plain.app, plain.retriever, len(plain.payload_hash)) == ("shop", "bm25-v1", 64)
    assert plain.id not in passages
    # Gold (judged) and the one that looks bad keep every text and passage.
    for name, n in (("gold", 4), ("looped", 2)):
        assert rows[name].texts_kept is True, name
        assert rows[name].query == sent[name]["query"]
        assert passages[rows[name].id or 0] == n, name
    assert (view["texts_kept"], view["query"], view["passages"]) == (False, "", [])
    assert view["status"] == "skipped"
    # The event's page says why there is nothing to read, and only for the narrow one.
    assert narrow_page.status_code == 200
    assert 'id="narrow"' in narrow_page.text
    assert 'id="narrow"' not in kept_page.text
    assert sent["gold"]["query"] in kept_page.text
    assert kept_view["texts_kept"] is True
    assert len(kept_view["passages"]) == 4


def test_with_keep_texts_all_every_event_keeps_its_texts(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = _narrow_settings(tmp_path, store_url, redis_url, keep_texts="all")
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events/batch", json={"events": _mixed_batch()}).status_code == 200
    rows = _rows(settings)
    assert all(row.texts_kept for row in rows.values())
    assert rows["plain"].query
    assert rows["plain"].response == "an answer"
    assert _passage_rows(settings)[rows["plain"].id or 0] == 4


def test_the_kept_share_is_decided_by_the_event_id(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    ids = [f"share-{i}" for i in range(40)]
    settings = _narrow_settings(tmp_path, store_url, redis_url, keep_texts_share=0.5)
    with TestClient(create_app(settings)) as client:
        body = {"events": [make_event(event_id) for event_id in ids]}
        assert client.post("/v1/events/batch", json=body).json()["accepted"] == len(ids)
    rows = _rows(settings)
    kept = {event_id for event_id in ids if rows[event_id].texts_kept}
    assert kept == {event_id for event_id in ids if keep_point(event_id) < 0.5}
    assert 0 < len(kept) < len(ids)  # both kinds present, or the test proves nothing


def test_a_narrow_event_answers_a_resend_and_a_changed_body(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = _narrow_settings(tmp_path, store_url, redis_url)
    first = make_event("single", response="an answer")
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events", json=first).status_code == 202
        assert (
            client.post("/v1/events/batch", json={"events": [make_event("batched")]}).json()[
                "accepted"
            ]
            == 1
        )
        resend = client.post("/v1/events", json=first)
        changed = client.post("/v1/events", json={**first, "query": "another question"})
        batch = client.post(
            "/v1/events/batch",
            json={"events": [make_event("batched"), make_event("batched", n=2), first]},
        ).json()
    assert _rows(settings)["single"].texts_kept is False
    assert resend.status_code == 200
    assert resend.json()["status"] == "duplicate"
    assert changed.status_code == 409, changed.text
    assert [r["status"] for r in batch["results"]] == ["duplicate", "rejected", "duplicate"]
    assert "different event" in batch["results"][1]["error"]
    assert len(_rows(settings)) == 2


def test_feedback_on_a_narrow_event_is_stored_and_counted(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = _narrow_settings(tmp_path, store_url, redis_url)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events", json=make_event("later")).status_code == 202
        answer = client.post(
            "/v1/events/later/feedback",
            json={"response_grade": 4, "answer_correct": True, "response": "the answer text"},
        )
        assert answer.status_code == 200, answer.text
        text_only = client.post("/v1/events/later/feedback", json={"response": "again"})
        assert text_only.status_code == 200, text_only.text
        metrics = client.get("/metrics").text
    row = _rows(settings)["later"]
    assert (row.response_grade, row.answer_correct, row.response) == (4, True, None)
    assert _counter(metrics, "retrieval_monitor_feedback_total") == 2


def test_gold_marked_later_on_a_narrow_event_is_refused_with_the_reason(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = _narrow_settings(tmp_path, store_url, redis_url)
    with TestClient(create_app(settings)) as client:
        body = {"events": [make_event("narrow"), make_event("looped", passages=_looped())]}
        assert client.post("/v1/events/batch", json=body).json()["accepted"] == 2
        refused = client.post("/v1/events/narrow/gold", json={"outcome": "not_in_corpus"})
        kept = client.post("/v1/events/looped/gold", json={"outcome": "not_in_corpus"})
    assert refused.status_code == 409, refused.text
    assert "RM_KEEP_TEXTS" in refused.json()["detail"]
    assert kept.status_code == 200, kept.text


def _looped() -> list[dict[str, str]]:
    return [{"text": REPEATED}, {"text": REPEATED.upper()}]


def _counter(metrics: str, name: str) -> float:
    return sum(
        sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == name
    )


# Families whose value depends on timing or on the process, not on the events sent.
_TIMING = (
    "retrieval_monitor_http_",
    "retrieval_monitor_pipeline_lag",
    "retrieval_monitor_queue",
    "retrieval_monitor_oldest_pending_event_age",
)


def _event_counts(metrics: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics that counts events, by name and labels."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name.startswith("retrieval_monitor_")
        and not sample.name.startswith(_TIMING)
        and not sample.name.endswith("_created")
    }


@pytest.fixture
def flushed_redis(redis_url: str) -> Iterator[str]:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    yield redis_url
    client.flushdb()


def test_every_counter_is_the_same_whether_events_keep_their_texts(
    tmp_path: Path, store_url: str, flushed_redis: str
) -> None:
    events = [
        *_mixed_batch(),
        *(make_event(f"more-{i}", n=3 + i % 4, k=3) for i in range(20)),
    ]
    seen: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for policy in ("all", "needed"):
        _empty(store_url)
        settings = _narrow_settings(tmp_path, store_url, flushed_redis, keep_texts=policy)
        with TestClient(create_app(settings)) as client:
            answer = client.post("/v1/events/batch", json={"events": events}).json()
            assert answer["accepted"] == len(events)
            assert client.post("/v1/events", json=events[0]).status_code == 200  # a resend
            seen[policy] = _event_counts(client.get("/metrics").text)
        narrow = [row for row in _rows(settings).values() if not row.texts_kept]
        assert bool(narrow) == (policy == "needed")
        redis.Redis.from_url(flushed_redis).flushdb()
    assert seen["needed"] == seen["all"]
    accepted = sum(
        value
        for (name, _labels), value in seen["all"].items()
        if name == "retrieval_monitor_events_accepted_total"
    )
    assert accepted == len(events)


def _empty(store_url: str) -> None:
    """Every table of the schema emptied (read from the models, so a new table is too)."""
    engine = make_engine(store_url)
    with engine.begin() as conn:
        for table in reversed(schema_tables(engine.dialect.name)):
            conn.execute(table.delete())
    engine.dispose()


def test_rejudge_the_labelling_queue_and_the_workers_leave_narrow_rows_out(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = _narrow_settings(tmp_path, store_url, redis_url)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events/batch", json={"events": _mixed_batch()}).status_code == 200
    rows = _rows(settings)
    narrow_pk = rows["plain"].id
    assert narrow_pk is not None
    now = utcnow()
    selection = spend_store.RejudgeSelection(
        since=now - timedelta(days=1),
        until=now + timedelta(days=1),
        tenant=rows["plain"].tenant,
        app=None,
        retriever=None,
        include_skipped=True,
        after_pk=0,
        without_judge=None,
    )
    window = EventWindow(now - timedelta(days=1), now + timedelta(days=1))
    engine = make_engine(settings.database_url)
    with session_scope(engine) as session:
        candidates = {pk for pk, _ in spend_store.rejudge_candidates(session, selection)}
        narrow = spend_store.narrow_events(session, selection)
        loaded = {e.pk for e in load_many_for_judging(session, [r.id or 0 for r in rows.values()])}
        queue = queue_state(session, window, seed=1, target=10, labeller="me", reps=10)
        texts = session.execute(select(func.count()).select_from(PassageText)).scalar_one()
    engine.dispose()
    kept = {row.id for name, row in rows.items() if name != "plain"}
    # Gold is still pending (no worker here): a re-judge sends judged, failed and skipped ones.
    assert candidates == {rows["looped"].id}
    assert narrow == 1
    assert loaded == kept
    assert {c.pk for c in queue.sample} == kept
    assert queue.narrow == 1
    assert texts > 0


def test_every_read_answers_with_narrow_events_in_the_window(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    """Each GET route of the app, pages included (read from its routes, so one added later is
    walked too), answers a window holding narrow and kept events, with the path's event a
    narrow one, without a server error."""
    settings = _narrow_settings(tmp_path, store_url, redis_url)
    with TestClient(ui_app(settings)) as client:
        events = [*_mixed_batch(), *(make_event(f"n-{i}", query=f"q {i}") for i in range(10))]
        assert client.post("/v1/events/batch", json={"events": events}).status_code == 200
        engine = client.app.state.rm.runtime.engine  # type: ignore[attr-defined]
        judge(engine, "gold", [3, 0, 1, 2])
        answers = {}
        for route in every_route(client.app):  # type: ignore[arg-type]
            if route.method != "GET":
                continue
            url = route.url(event_id="plain", name="ui.css")
            params = {"baseline": "previous"} if route.path == "/v1/analysis/compare" else None
            answers[route.path] = client.get(url, params=params, follow_redirects=True)
    assert len(_rows(settings)) == len(events)
    assert not _rows(settings)["plain"].texts_kept
    failed = {path: a.status_code for path, a in answers.items() if a.status_code >= 500}
    assert failed == {}
    assert answers["/v1/events/{event_id}"].status_code == 200
    assert answers["/ui/events/{event_id}"].status_code == 200
