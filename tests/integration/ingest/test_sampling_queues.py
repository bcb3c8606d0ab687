"""Sampling at ingest through the real app: unsampled events are stored as skipped, gold and
other retrievers' events wait for the judge (gold on the urgent queue), and /metrics counts the
sampled share."""

from __future__ import annotations

from pathlib import Path

import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.api.app import create_app
from service.ingest.sampling import sample_point
from service.queue.names import urgent_queue
from service.store.migrate import upgrade
from tests.support.environment import make_settings
from tests.support.helpers import make_event


def test_ingest_skips_unsampled_events_and_counts_the_sampled_share(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(
        tmp_path, sqlite_url, redis_url, sample_rate=1.0, sample_rates={"shop/bm25-v1": 0.3}
    )
    events = [make_event(f"req-{i}", n=3) for i in range(200)]
    events += [make_event(f"gold-{i}", n=3, gold_passage_ids=["d1"]) for i in range(5)]
    events += [make_event(f"other-{i}", n=3, retriever="dense") for i in range(10)]
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events/batch", json={"events": events}).status_code == 200
        statuses = {e["event_id"]: client.get(f"/v1/events/{e['event_id']}").json() for e in events}
        text = client.get("/metrics").text

    expected = {f"req-{i}" for i in range(200) if sample_point(f"req-{i}") < 0.3}
    skipped = {i for i, body in statuses.items() if body["status"] == "skipped"}
    assert skipped == {f"req-{i}" for i in range(200)} - expected
    assert 40 <= len(expected) <= 80
    assert all(statuses[f"gold-{i}"]["status"] == "pending" for i in range(5))
    assert all(statuses[f"other-{i}"]["status"] == "pending" for i in range(10))

    def value(name: str, **labels: str) -> float:
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    sampled = "retrieval_monitor_events_sampled_total"
    assert value(sampled, retriever="bm25-v1", reason="sampled") == len(expected)
    assert value(sampled, retriever="bm25-v1", reason="gold") == 5
    assert value(sampled, retriever="dense", reason="sampled") == 10
    assert value("retrieval_monitor_events_skipped_total", reason="unsampled") == len(skipped)
    # Gold goes to the urgent queue, the rest in one batch message to the normal one.
    queues = redis.Redis.from_url(redis_url)
    assert queues.llen(urgent_queue(settings.queue_name)) == 1
    assert queues.llen(settings.queue_name) == 1
