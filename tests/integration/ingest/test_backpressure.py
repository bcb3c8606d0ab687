"""Overload is a 503 or 429 with Retry-After, never a 500 and never an unbounded queue; a broker
that may evict the queue is refused; the judge's rate is shared by every worker.

Tests ``service.ingest.admission``, ``service.queue.redis_check`` and ``service.queue.ratelimit``.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.config.settings import Settings
from service.ingest.admission import Admission
from service.ingest.backpressure import Backpressure
from service.queue.redis_check import eviction_problem
from service.store.migrate import upgrade
from service.wiring.runtime import Runtime
from tests.support.database import count_rows
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event
from tests.support.live import WorkerFactory, private_redis, processes_that_judged, wait_for
from tests.support.metrics_reading import sample


def test_a_backlog_over_the_bound_gets_503_with_retry_after(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(
        tmp_path, sqlite_url, redis_url, max_pending_events=3, backpressure_refresh_seconds=0.01
    )
    app = create_app(settings)
    with TestClient(app) as client:
        for i in range(3):
            assert client.post("/v1/events", json=make_event(f"e{i}")).status_code == 202
        # The bound sees the backlog once the count is re-read: wait for that, not for a time.
        backpressure: Backpressure = app.state.rm.admission.backpressure
        wait_for(lambda: backpressure.pending_events() == 3, timeout=10, interval=0.01)
        response = client.post("/v1/events", json=make_event("e3"))
        assert response.status_code == 503
        assert response.headers["Retry-After"] == str(settings.backpressure_retry_after_seconds)
        assert "3 events wait for judging" in response.json()["detail"]
        batch = client.post("/v1/events/batch", json={"events": [make_event("e4")]})
        assert batch.status_code == 503
        assert sample(client, "retrieval_monitor_events_rejected_total", reason="backlog") == 2
    from service.store.models import Event

    assert count_rows(settings, Event) == 3  # what was accepted stays


def test_admission_on_cached_figures_is_decided_in_the_event_loop_with_the_same_answer(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    """The single-event route decides admission in place only when no query or Redis call is
    needed (a fresh backlog count, no tenant rate); its refusal is the thread pool's."""
    upgrade(sqlite_url)
    settings = make_settings(
        tmp_path, sqlite_url, redis_url, max_pending_events=3, backpressure_refresh_seconds=3
    )
    app = create_app(settings)
    admission: Admission = app.state.rm.admission
    with TestClient(app) as client:
        assert not admission.admits_without_io()  # never counted: the COUNT is the pool's
        for i in range(3):
            assert client.post("/v1/events", json=make_event(f"e{i}")).status_code == 202
        wait_for(lambda: admission.backpressure.pending_events() == 3, timeout=10, interval=0.05)
        assert admission.admits_without_io()  # counted just now: this request is decided in place
        response = client.post("/v1/events", json=make_event("e3"))
        assert response.status_code == 503
        assert response.headers["Retry-After"] == str(settings.backpressure_retry_after_seconds)
        assert "3 events wait for judging" in response.json()["detail"]
        assert sample(client, "retrieval_monitor_events_rejected_total", reason="backlog") == 1
    limited = settings.model_copy(update={"tenant_events_per_second": 5.0})
    limited_runtime = Runtime(limited)
    rated = Admission(limited_runtime, Backpressure(limited_runtime))
    rated.backpressure.pending_events()
    assert not rated.admits_without_io()  # a token bucket in Redis: the pool's


def test_slow_commits_refuse_ingest_until_the_database_had_time_to_recover(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    """While commits are slow every request is refused, so no new commit can bring the average
    down: it fades with time instead, and ingest resumes once the database had time."""
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, max_commit_seconds=2.0)
    now = [1000.0]
    backpressure = Backpressure(Runtime(settings), clock=lambda: now[0])
    for _ in range(10):
        backpressure.record_commit(3.0)
    refused = backpressure.check()
    assert refused is not None
    assert refused.reason == "slow_database"
    now[0] += 1.0
    assert backpressure.check() is not None  # a second later it is still too slow
    now[0] += 5.0
    assert backpressure.check() is None  # faded below the bound: a request may go through
    # If the database is still slow, the commits that follow bring the refusal back.
    for _ in range(5):
        backpressure.record_commit(3.0)
    assert backpressure.check() is not None


def test_a_tenant_over_its_rate_gets_429(tmp_path: Path, sqlite_url: str, redis_url: str) -> None:
    upgrade(sqlite_url)
    settings = make_settings(
        tmp_path, sqlite_url, redis_url, tenant_events_per_second=1, tenant_burst_events=5
    )
    with TestClient(create_app(settings)) as client:
        statuses = [
            client.post("/v1/events", json=make_event(f"e{i}")).status_code for i in range(8)
        ]
        assert statuses[:5] == [202] * 5
        assert 429 in statuses[5:]
        refused = client.post("/v1/events", json=make_event("late"))
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert "over 1 events per second" in refused.json()["detail"]


@pytest.fixture
def evicting_redis(tmp_path: Path) -> Iterator[str]:
    with private_redis(tmp_path, "--maxmemory", "50mb", "--maxmemory-policy", "allkeys-lru") as url:
        yield url


def test_a_worker_refuses_a_broker_that_evicts(
    tmp_path: Path, sqlite_url: str, evicting_redis: str, worker_factory: WorkerFactory
) -> None:
    assert "allkeys-lru" in (eviction_problem(redis.Redis.from_url(evicting_redis)) or "")
    assert eviction_problem(redis.Redis.from_url(evicting_redis, db=0)) is not None
    upgrade(sqlite_url)
    worker = worker_factory(make_settings(tmp_path, sqlite_url, evicting_redis))
    with pytest.raises(RuntimeError, match=r"refuses to start.*noeviction"):
        worker.start()


def test_the_default_broker_is_accepted(redis_url: str) -> None:
    assert eviction_problem(redis.Redis.from_url(redis_url)) is None


def test_the_judge_rate_is_shared_by_all_workers(
    tmp_path: Path,
    sqlite_url: str,
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
) -> None:
    rate = 4
    upgrade(sqlite_url)
    settings: Settings = make_settings(
        tmp_path,
        sqlite_url,
        redis_url,
        judge_base_url=fake_llm.base_url,
        judge_calls_per_second=rate,
        judge_slice_events=2,  # many small tasks, so that every process gets some
    )
    workers = [worker_factory(settings, concurrency=2).start() for _ in range(2)]
    events = 40
    with TestClient(create_app(settings)) as client:
        batch = [make_event(f"r{i}", n=2, query=f"question {i}") for i in range(events)]
        assert client.post("/v1/events/batch", json={"events": batch}).json()["accepted"] == events
        wait_for(lambda: sample(client, "retrieval_monitor_events_judged_total") == events, 180)
    # The calls came from both worker processes (and more than one pool process), competing.
    took_part = processes_that_judged(workers)
    assert len({log for log, _ in took_part}) == 2, took_part
    # Read on the judge's own clock: one shared bucket of 4 calls/s with a burst of 4, so no
    # second holds more than rate + burst calls, whichever process made them.
    times = sorted(fake_llm.stats()["call_times"])
    assert len(times) == events
    busiest = max(bisect.bisect_left(times, t + 1.0) - i for i, t in enumerate(times))
    assert busiest <= rate + rate, busiest
