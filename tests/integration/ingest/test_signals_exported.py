"""Judge-free signals through the real app: every event's signals reach /metrics, sampled or
not, and a retrieval with no passage is refused and counted as empty."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.api.app import create_app
from service.store.migrate import upgrade
from tests.support.environment import make_settings
from tests.support.helpers import make_event

TEXT = "the quick brown fox jumps over the lazy dog near the river bank today"


def test_ingest_exports_the_signals_of_every_event_sampled_or_not(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, sample_rate=0.0)
    plain = make_event("plain", n=3)  # scores 9, 8, 7
    repeated = make_event("repeated", n=2)
    repeated["passages"] = [{"text": TEXT, "score": 0.8}, {"text": TEXT.upper(), "score": 0.7}]
    with TestClient(create_app(settings)) as client:
        body = {"events": [plain, repeated]}
        assert client.post("/v1/events/batch", json=body).status_code == 200
        text = client.get("/metrics").text
        assert client.get("/v1/events/plain").json()["status"] == "skipped"

    def value(name: str, **labels: str) -> float:
        return sum(
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )

    ns = "retrieval_monitor_signal_"
    assert value(ns + "top_score_count") == 2
    assert value(ns + "top_score_sum") == pytest.approx(9.0 + 0.8)
    assert value(ns + "score_gap_sum") == pytest.approx(2.0 + 0.1)
    assert value(ns + "top_score_bucket", le="1.0") == 1  # 0.8; 9.0 is above
    assert value(ns + "duplicate_ratio_sum") == pytest.approx(0.5)
    assert value(ns + "passage_length_characters_count") == 5
    assert value(ns + "short_retrievals_total") == 1  # two passages, under the bound of 3
    assert value(ns + "empty_retrievals_total") == 0


def test_a_retrieval_with_no_passage_is_refused_and_counted_as_empty(client: TestClient) -> None:
    from tests.support.metrics_reading import sample

    body = {"app": "shop", "retriever": "r1", "query": "anything", "passages": []}
    response = client.post("/v1/events", json=body)
    assert response.status_code == 422
    assert "at least one passage" in response.json()["detail"]
    batch = client.post("/v1/events/batch", json={"events": [body, {**body, "app": "other"}]})
    assert batch.json()["rejected"] == 2
    name = "retrieval_monitor_signal_empty_retrievals_total"
    assert sample(client, name, app="shop", retriever="r1") == 2
    assert sample(client, name, app="other") == 1
    assert sample(client, "retrieval_monitor_events_rejected_total", reason="empty_retrieval") == 3
