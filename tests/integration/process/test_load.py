"""Load: many events with duplicates mixed in, from concurrent clients over loopback. Afterwards
accepted = stored = judged, and /metrics agrees with the database.

The size is RM_LOAD_EVENTS (default 100,000). Loopback only, bounded in count and in time.

This machine's PostgreSQL runs with autovacuum off, so the planner has no statistics of the growing
tables: the hot lookups must hold without them (tests/integration/store/test_lookups.py). Without
them the
known-id lookup once scanned every event per batch and ingest fell from 1,709 to 314 events/s over
the run.
"""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from service.store.migrate import upgrade
from tests.support.database import judged_and_exported
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.live import LiveServer, WorkerFactory, wait_for

pytestmark = pytest.mark.slow

EVENTS = int(os.environ.get("RM_LOAD_EVENTS", "100000"))
BATCH = 200
CLIENTS = 4
DUPLICATE_SHARE = 0.1
TIME_LIMIT_SECONDS = 1500
# A small vocabulary of queries and passages: the label cache soon answers every passage's grade,
# but each event's top-k set is new, so nearly every event still makes one judge call for its
# context rating.
QUERIES = [f"question {i} about the pipeline" for i in range(50)]
PASSAGES = [f"passage {i} with some words about topic {i % 17}" for i in range(200)]


def event(n: int) -> dict[str, object]:
    rng = random.Random(n)
    return {
        "event_id": f"load-{n}",
        "app": f"app{n % 3}",
        "retriever": "r1",
        "query": QUERIES[n % len(QUERIES)],
        "passages": [{"id": f"p{j}", "text": PASSAGES[j]} for j in rng.sample(range(200), 6)],
        "k": 3,
    }


def metrics(url: str) -> dict[str, float]:
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        for s in family.samples:
            totals[s.name] = totals.get(s.name, 0.0) + s.value
    return totals


def test_many_events_with_duplicates_are_all_stored_and_judged_once(
    tmp_path: Path,
    postgres_url: str,
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
) -> None:
    upgrade(postgres_url)
    settings = make_settings(
        tmp_path,
        postgres_url,
        redis_url,
        judge_base_url=fake_llm.base_url,
        # A backlog bound the run goes past, so the overload answers and their retries after
        # Retry-After are part of it.
        max_pending_events=max(BATCH * CLIENTS, EVENTS // 5),
        # Counted at every batch, so the bound answers as soon as the held backlog reaches it.
        backpressure_refresh_seconds=0.001,
        max_batch_events=BATCH * 2,
    )
    fake_llm.set_labels({(None, PASSAGES[j]): j % 4 for j in range(200)})
    # The judge is held until the first overload answer: the backlog then grows past its bound
    # however fast the workers would judge on this machine, so the refusals and their retries
    # are part of every run.
    fake_llm.hold(at_most=TIME_LIMIT_SECONDS)
    worker_factory(settings, concurrency=2).start()
    # Each client sends its share; about a tenth of every batch repeats earlier events.
    numbers = list(range(EVENTS))
    shares = [numbers[c::CLIENTS] for c in range(CLIENTS)]
    outcome = {"accepted": 0, "duplicate": 0, "rejected": 0, "sent": 0, "refused": 0}
    failures: list[BaseException] = []
    lock = threading.Lock()
    deadline = time.monotonic() + TIME_LIMIT_SECONDS

    with LiveServer(settings) as server:

        def client(share: list[int]) -> None:
            try:
                send_share(share)
            except BaseException as exc:  # the test fails now, not after waiting for judging
                failures.append(exc)

        def send_share(share: list[int]) -> None:
            rng = random.Random(share[0] if share else 0)
            with httpx.Client(base_url=server.url, timeout=60) as http:
                for start in range(0, len(share), BATCH):
                    chunk = share[start : start + BATCH]
                    repeats = rng.sample(
                        share[: start + 1], k=min(start + 1, int(BATCH * DUPLICATE_SHARE))
                    )
                    body = {"events": [event(n) for n in chunk + repeats]}
                    while time.monotonic() < deadline:
                        response = http.post("/v1/events/batch", json=body)
                        if response.status_code == 200:
                            break
                        assert response.status_code in (429, 503), response.text
                        with lock:
                            outcome["refused"] += 1
                            if outcome["refused"] == 1:
                                fake_llm.release()  # the bound answered: let the judging go on
                        time.sleep(float(response.headers["Retry-After"]))
                    result = response.json()
                    with lock:
                        for key in ("accepted", "duplicate", "rejected"):
                            outcome[key] += result[key]
                        outcome["sent"] += len(body["events"])

        started = time.monotonic()
        threads = [threading.Thread(target=client, args=(share,)) for share in shares]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        ingest_seconds = time.monotonic() - started
        assert not failures, failures[:3]

        wait_for(
            lambda: judged_and_exported(settings) == EVENTS,
            timeout=max(60.0, deadline - time.monotonic()),
            interval=2,
        )
        total_seconds = time.monotonic() - started
        engine = create_engine(postgres_url)
        with engine.connect() as conn:
            stored = int(conn.execute(text("SELECT count(*) FROM events")).scalar_one())
            scores = int(conn.execute(text("SELECT count(*) FROM scores")).scalar_one())
        engine.dispose()
        exported = metrics(server.url)

    assert outcome["rejected"] == 0
    assert outcome["refused"] > 0, "the backlog bound never answered 503: nothing was retried"
    assert outcome["accepted"] == EVENTS == stored == scores
    assert outcome["duplicate"] == outcome["sent"] - EVENTS
    assert exported["retrieval_monitor_events_accepted_total"] == EVENTS
    assert exported["retrieval_monitor_events_duplicate_total"] == outcome["duplicate"]
    assert exported["retrieval_monitor_events_judged_total"] == EVENTS
    assert exported["retrieval_monitor_measure_precision_count"] == EVENTS
    print(
        f"\n{EVENTS} events (+{outcome['duplicate']} duplicates) stored in {ingest_seconds:.0f}s "
        f"({EVENTS / ingest_seconds:.0f}/s), all judged after {total_seconds:.0f}s "
        f"({EVENTS / total_seconds:.0f}/s), {outcome['refused']} overload answers retried"
    )
