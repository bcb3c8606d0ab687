"""The sampling decision: deterministic, nested across rates, near the configured share."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from service.api.app import create_app
from service.ingest.sampling import decide, rate_for, sample_point
from service.queue import urgent_queue
from service.store.migrate import upgrade
from tests.conftest import make_settings
from tests.helpers import make_event

IDS = [f"req-{i}" for i in range(20_000)]


def sampled(rate: float, ids: list[str] = IDS) -> set[str]:
    return {i for i in ids if decide(i, "app", "r", False, rate, {}).judge}


def test_a_lower_rate_sample_is_a_subset_of_a_higher_one() -> None:
    rates = [0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 0.9, 1.0]
    samples = [sampled(rate) for rate in rates]
    for lower, higher in itertools.pairwise(samples):
        assert lower <= higher
    assert samples[0] == set()
    assert samples[-1] == set(IDS)


def test_subset_holds_for_random_rate_pairs_and_ids() -> None:
    rng = random.Random(7)
    ids = [f"{rng.getrandbits(64):x}" for _ in range(2_000)]
    for _ in range(50):
        a, b = sorted(rng.random() for _ in range(2))
        assert sampled(a, ids) <= sampled(b, ids)


def test_share_is_close_to_the_rate() -> None:
    for rate in (0.01, 0.1, 0.5):
        share = len(sampled(rate)) / len(IDS)
        # Binomial standard error at n = 20000 is at most 0.0036; four of them.
        assert abs(share - rate) < 0.015, (rate, share)


def test_decision_is_deterministic_and_depends_only_on_the_id() -> None:
    assert sample_point("abc") == sample_point("abc")
    assert 0.0 <= sample_point("abc") < 1.0
    first = decide("req-1", "a", "r", False, 0.3, {})
    assert first == decide("req-1", "a", "r", False, 0.3, {})
    # The same id under another app at the same rate gets the same answer.
    assert decide("req-1", "b", "x", False, 0.3, {}).judge == first.judge


def test_gold_is_always_judged() -> None:
    decision = decide("req-1", "a", "r", True, 0.0, {})
    assert decision.judge
    assert decision.reason == "gold"
    unsampled = [i for i in IDS[:100] if not decide(i, "a", "r", False, 0.0, {}).judge]
    assert len(unsampled) == 100


def test_most_specific_rate_wins() -> None:
    rates = {"bot": 0.2, "bot/hybrid": 0.7}
    assert rate_for("bot", "hybrid", 1.0, rates) == 0.7
    assert rate_for("bot", "bm25", 1.0, rates) == 0.2
    assert rate_for("other", "hybrid", 0.4, rates) == 0.4
    assert rate_for("bot", "x", 1.0, {"bot": 3.0}) == 1.0  # clamped
    assert decide("req-1", "bot", "bm25", False, 1.0, rates).rate == 0.2


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
