"""The v1 ingest contract against the real app, a SQLite file and the real Redis.

Tests ``service.api.events``, ``service.api.health``, ``service.api.docs``,
``service.contract.schemas`` and ``service.http.decoded_batch``.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config.settings import Settings
from service.contract.event_decoder import decode_valid_batch
from service.contract.schemas import DecodedEvents
from service.http import decoded_batch
from service.store.models import Event, Passage
from tests.support.database import count_rows
from tests.support.helpers import make_event
from tests.support.metrics_reading import sample


def test_accepts_an_event_and_stores_it_with_its_passages(
    client: TestClient, settings: Settings
) -> None:
    response = client.post("/v1/events", json=make_event("ev-1", n=6, k=3))
    assert response.status_code == 202
    assert response.json() == {"event_id": "ev-1", "status": "accepted", "error": None}
    assert count_rows(settings, Event) == 1
    assert count_rows(settings, Passage) == 6
    stored = client.get("/v1/events/ev-1").json()
    assert stored["status"] == "pending"
    assert stored["k"] == 3
    assert [p["id"] for p in stored["passages"]] == [f"d{i}" for i in range(1, 7)]
    assert [p["in_top_k"] for p in stored["passages"]] == [True] * 3 + [False] * 3
    assert stored["measures"] == {}
    assert sample(client, "retrieval_monitor_events_accepted_total", app="shop") == 1


def test_a_resend_is_a_duplicate_and_stores_nothing_new(
    client: TestClient, settings: Settings
) -> None:
    assert client.post("/v1/events", json=make_event("ev-1")).status_code == 202
    again = client.post("/v1/events", json=make_event("ev-1"))
    assert again.status_code == 200
    assert again.json()["status"] == "duplicate"
    assert count_rows(settings, Event) == 1
    assert sample(client, "retrieval_monitor_events_accepted_total") == 1
    assert sample(client, "retrieval_monitor_events_duplicate_total") == 1


def test_reusing_an_event_id_for_other_content_is_a_conflict(client: TestClient) -> None:
    client.post("/v1/events", json=make_event("ev-1"))
    response = client.post("/v1/events", json=make_event("ev-1", query="another question"))
    assert response.status_code == 409
    assert "different event" in response.json()["detail"]


def test_event_id_is_generated_when_absent(client: TestClient) -> None:
    response = client.post("/v1/events", json=make_event(None))
    assert response.status_code == 202
    generated = response.json()["event_id"]
    assert len(generated) == 32
    assert client.get(f"/v1/events/{generated}").status_code == 200


def test_passages_without_ids_get_stable_content_ids(client: TestClient) -> None:
    event = make_event("ev-1")
    for passage in event["passages"]:
        del passage["id"]
    client.post("/v1/events", json=event)
    ids = [p["id"] for p in client.get("/v1/events/ev-1").json()["passages"]]
    assert all(i.startswith("sha256:") for i in ids)
    assert len(set(ids)) == len(ids)


def rejected(client: TestClient, body: object, status: int = 422) -> str:
    response = client.post("/v1/events", json=body)
    assert response.status_code == status, response.text
    detail: str = response.json()["detail"]
    return detail


def test_bad_events_get_clear_4xx_messages(client: TestClient, settings: Settings) -> None:
    assert "query is empty" in rejected(client, make_event(query="  "))
    assert "at least one passage" in rejected(client, {**make_event(), "passages": []})
    assert "greater than or equal to 1" in rejected(client, make_event(k=0))
    assert "(4), got 5" in rejected(client, make_event(k=5))
    assert "passage text is empty" in rejected(client, {**make_event(), "passages": [{"text": ""}]})
    assert "passages" in rejected(client, {**make_event(), "passages": "not a list"})
    assert "k" in rejected(client, {**make_event(), "k": "three"})
    assert "app" in rejected(client, {"query": "q", "retriever": "r", "passages": [{"text": "t"}]})
    assert "extra" in rejected(client, {**make_event(), "unknown_field": 1}).lower()
    assert "unique" in rejected(
        client, {**make_event(), "passages": [{"id": "a", "text": "x"}, {"id": "a", "text": "y"}]}
    )
    assert count_rows(settings, Event) == 0
    assert sample(client, "retrieval_monitor_events_rejected_total", reason="invalid") == 9
    assert sample(client, "retrieval_monitor_events_rejected_total", reason="empty_retrieval") == 1


def test_limits_come_from_settings(client: TestClient, settings: Settings) -> None:
    too_many = make_event(n=settings.max_passages + 1)
    assert "too many passages" in rejected(client, too_many)
    long_passage = make_event()
    long_passage["passages"][0]["text"] = "x" * (settings.max_passage_chars + 1)
    assert "passage 1 too long" in rejected(client, long_passage)
    assert "query too long" in rejected(
        client, make_event(query="q" * (settings.max_query_chars + 1))
    )
    assert "metadata too large" in rejected(
        client, make_event(metadata={"blob": "m" * settings.max_metadata_bytes})
    )
    assert sample(client, "retrieval_monitor_events_rejected_total", reason="limits") == 4


def test_malformed_json_and_oversized_bodies(client: TestClient, settings: Settings) -> None:
    response = client.post(
        "/v1/events", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert "JSON" in response.json()["detail"]
    huge = b"x" * (settings.max_body_bytes + 1)
    response = client.post("/v1/events", content=huge, headers={"content-type": "application/json"})
    assert response.status_code == 413
    bomb = gzip.compress(b" " * (settings.max_body_bytes * 2))
    response = client.post(
        "/v1/events",
        content=bomb,
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert response.status_code == 413
    response = client.post(
        "/v1/events",
        content=b"not gzip at all",
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert response.status_code == 400


def test_gzip_bodies_are_accepted(client: TestClient) -> None:
    body = gzip.compress(json.dumps(make_event("ev-gz")).encode())
    response = client.post(
        "/v1/events",
        content=body,
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert response.status_code == 202


def test_batch_gives_a_result_per_event(client: TestClient, settings: Settings) -> None:
    client.post("/v1/events", json=make_event("known"))
    batch = {
        "events": [
            make_event("b1"),
            make_event("known"),
            make_event("b2", k=99),
            make_event("b3"),
            make_event("b1"),  # the same event twice in one batch
            make_event("known", query="changed"),
        ]
    }
    response = client.post("/v1/events/batch", json=batch)
    assert response.status_code == 200
    body = response.json()
    statuses = [(r["event_id"], r["status"]) for r in body["results"]]
    assert statuses == [
        ("b1", "accepted"),
        ("known", "duplicate"),
        ("b2", "rejected"),
        ("b3", "accepted"),
        ("b1", "duplicate"),
        ("known", "rejected"),
    ]
    assert "k must be between" in body["results"][2]["error"]
    assert (body["accepted"], body["duplicate"], body["rejected"]) == (2, 2, 2)
    assert count_rows(settings, Event) == 3


def test_a_batch_read_from_its_bytes_answers_and_stores_as_the_models_reading_does(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same events in two batches: all valid, read by the compiled decoder; then again
    # with one invalid event among them, which hands the whole body back to the models.
    readings: list[bool] = []

    def recorded(body: bytes, settings: Settings) -> DecodedEvents | None:
        events = decode_valid_batch(body, settings)
        readings.append(events is not None)
        return events

    monkeypatch.setattr(decoded_batch, "decode_valid_batch", recorded)
    client.post("/v1/events", json=make_event("known"))
    extra: dict[str, Any] = {
        "timestamp": "2026-11-30T10:00:00.5+02:00",
        "metadata": {"team": "search", "n": [1, 2.5, None]},
        "candidates": [{"id": "c1", "score": 3}],
        "gold_passage_ids": ["d1", "d1"],
        "response_grade": 4,
    }

    def batch(prefix: str) -> list[dict[str, Any]]:
        return [
            make_event(f"{prefix}1", **extra),
            make_event("known"),
            make_event(
                f"{prefix}2", n=3, k=2, environment="prod", timestamp="2026-11-30T09:00:00Z"
            ),
            make_event("known", query="changed"),
            make_event(f"{prefix}1", **extra),
        ]

    decoded = client.post("/v1/events/batch", json={"events": batch("a")})
    by_models = client.post(
        "/v1/events/batch", json={"events": [*batch("b"), make_event("bad", k=99)]}
    )
    assert readings == [True, False]
    assert decoded.status_code == by_models.status_code == 200

    def results(answer: dict[str, Any]) -> list[tuple[str, str | None]]:
        return [(r["status"], r["error"]) for r in answer["results"]]

    assert results(decoded.json()) == results(by_models.json())[:5]
    for number in (1, 2):
        first = client.get(f"/v1/events/a{number}").json()
        second = client.get(f"/v1/events/b{number}").json()
        for view in (first, second):
            view.pop("event_id")
            view.pop("received_at", None)
        assert first == second


def test_batch_size_limit(client: TestClient, settings: Settings) -> None:
    events = [make_event(f"e{i}") for i in range(settings.max_batch_events + 1)]
    response = client.post("/v1/events/batch", json={"events": events})
    assert response.status_code == 422
    assert "max_batch_events" in response.json()["detail"]


def test_feedback_is_recorded_and_unknown_events_are_404(client: TestClient) -> None:
    client.post("/v1/events", json=make_event("ev-1"))
    response = client.post("/v1/events/ev-1/feedback", json={"response_grade": 4})
    assert response.status_code == 200
    response = client.post("/v1/events/ev-1/feedback", json={"answer_correct": True})
    stored = client.get("/v1/events/ev-1").json()
    assert (stored["response_grade"], stored["answer_correct"]) == (4, True)
    assert client.post("/v1/events/nope/feedback", json={"response_grade": 4}).status_code == 404
    assert client.post("/v1/events/ev-1/feedback", json={"response_grade": 9}).status_code == 422
    assert client.post("/v1/events/ev-1/feedback", json={}).status_code == 422
    assert client.get("/v1/events/nope").status_code == 404


def test_health_readiness_and_docs(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "database": "ok", "redis": "ok"}
    docs = client.get("/docs")
    assert docs.status_code == 200
    # Swagger UI from this service, nothing from a CDN.
    assert "/docs/assets/swagger-ui-bundle.js" in docs.text
    assert "https://" not in docs.text
    bundle = client.get("/docs/assets/swagger-ui-bundle.js")
    assert bundle.status_code == 200
    assert "javascript" in bundle.headers["content-type"]
    assert client.get("/redoc").status_code == 404
    spec = client.get("/openapi.json").json()
    assert {"/v1/events", "/v1/events/batch", "/v1/events/{event_id}"} <= set(spec["paths"])


def test_readiness_holds_through_a_redis_outage(tmp_path, sqlite_url) -> None:  # type: ignore[no-untyped-def]
    from service.api.app import create_app
    from service.store.migrate import upgrade
    from tests.support.environment import make_settings

    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, "redis://127.0.0.1:1/0")
    with TestClient(create_app(settings)) as client:
        ready = client.get("/readyz")
        # Still ready (every replica sees the same outage; pulling them all would refuse
        # ingest), but saying so.
        assert ready.status_code == 200
        assert ready.json()["status"] == "degraded"
        assert ready.json()["redis"].startswith("error")
        # Accepting still works: the event is committed; counting and enqueueing wait.
        assert client.post("/v1/events", json=make_event("ev-1")).status_code == 202


def test_readiness_reports_a_broker_apart_and_holds_through_its_outage(
    tmp_path: Path, sqlite_url: str, redis_url: str, rabbitmq_server_url: str
) -> None:
    from service.api.app import create_app
    from service.store.migrate import upgrade
    from tests.support.environment import make_settings

    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, broker_url=rabbitmq_server_url)
    with TestClient(create_app(settings)) as client:
        ready = client.get("/readyz")
        assert ready.json() == {"status": "ready", "database": "ok", "redis": "ok", "broker": "ok"}
        # The queue depth read from RabbitMQ (a queue never sent to holds none).
        assert "\nretrieval_monitor_queue_depth{" in client.get("/metrics").text
    down = make_settings(
        tmp_path, sqlite_url, redis_url, broker_url="amqp://guest:guest@127.0.0.1:1//"
    )
    with TestClient(create_app(down)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 200  # accepting needs only the database, as with Redis
        assert ready.json()["status"] == "degraded"
        assert ready.json()["broker"].startswith("error")
        assert ready.json()["redis"] == "ok"
        # The event is committed; its judge message waits for the sweeper.
        assert client.post("/v1/events", json=make_event("ev-1")).status_code == 202
        # The scrape still answers from Redis: only the queue depth, which the broker holds, is
        # left out.
        scrape = client.get("/metrics")
        assert scrape.status_code == 200
        assert "retrieval_monitor_events_accepted_total" in scrape.text
        assert "\nretrieval_monitor_queue_depth{" not in scrape.text


def test_readiness_fails_when_the_database_is_unreachable(tmp_path: Path, redis_url: str) -> None:
    from service.api.app import create_app
    from tests.support.environment import make_settings

    unreachable = "postgresql+psycopg://nobody@127.0.0.1:1/none?connect_timeout=2"
    settings = make_settings(tmp_path, unreachable, redis_url)
    with TestClient(create_app(settings)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["status"] == "not ready"
        assert ready.json()["database"].startswith("error")


def test_concurrent_sends_of_one_batch_store_each_event_once(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    import threading

    import httpx

    from tests.support.environment import make_settings
    from tests.support.live import LiveServer

    settings = make_settings(tmp_path, postgres_url, redis_url)
    batch = {"events": [make_event(f"race-{i}") for i in range(50)]}
    answers: list[dict[str, int]] = []
    with LiveServer(settings) as server:

        def send() -> None:
            response = httpx.post(f"{server.url}/v1/events/batch", json=batch, timeout=30)
            assert response.status_code == 200
            answers.append(response.json())

        threads = [threading.Thread(target=send) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(answers) == 4
    assert sum(a["accepted"] for a in answers) == 50
    assert sum(a["duplicate"] for a in answers) == 150
    assert count_rows(settings, Event) == 50
    assert count_rows(settings, Passage) == 200


def test_http_answers_are_counted_by_route_template(client: TestClient) -> None:
    from tests.support.live import wait_for

    client.post("/v1/events", json=make_event("counted"))
    client.get("/v1/events/counted")
    client.get("/v1/events/unknown-id")
    client.post(
        "/v1/events", content=b"x" * 20_000_000, headers={"content-type": "application/json"}
    )

    def counted() -> bool:
        return sample(client, "retrieval_monitor_http_responses_total") >= 4

    wait_for(counted, timeout=10)
    name = "retrieval_monitor_http_responses_total"
    assert sample(client, name, route="/v1/events", status_class="2xx") == 1
    assert sample(client, name, route="/v1/events", status_class="4xx") == 1  # the 413
    assert sample(client, name, route="/v1/events/{event_id}", status_class="2xx") == 1
    assert sample(client, name, route="/v1/events/{event_id}", status_class="4xx") == 1
