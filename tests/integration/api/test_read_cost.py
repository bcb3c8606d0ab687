"""Every read, page or API, costs the same memory whatever the volume behind it: each GET route of
the application (read from ``app.routes``) is measured (tracemalloc's peak while it answers) over
a window of ``SMALL`` events and again over ten times as many, with the same limits (the read
limit, ``max_read_events``, below both, as a large deployment's windows are above its default);
a read whose peak grows with the volume (a list, a sample or a scan held whole in the process
every tenant shares) fails. Events carry long queries and passages, so a read that holds texts
per event shows. On both stores.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.config.settings import Settings
from tests.support.environment import make_settings
from tests.support.helpers import judge, make_event
from tests.support.routes import every_route

SMALL = 150
READ_LIMIT = 20  # below the gold events of the smaller volume too (a fifth of them)
GROWTH = 10
BATCH = 500
# A read may grow by this much besides a fixed factor (the allocator's rounding, a bigger
# number to print); a read holding something per event grows by ten times its cost per event.
ALLOWED_FACTOR = 2.5
SLACK_BYTES = 512 * 1024
LONG = "lorem ipsum dolor sit amet " * 40  # about 1 KB
PARAMETERS = {
    "/v1/analysis/compare": {"baseline": "previous"},
}


def seed(client: TestClient, start: int, count: int) -> None:
    for first in range(start, start + count, BATCH):
        events = []
        for n in range(first, min(first + BATCH, start + count)):
            event = make_event(
                f"read-{n}",
                n=4,
                query=f"question {n} {LONG}",
                app=f"app{n % 3}",
                retriever=f"r{n % 2}",
            )
            for passage in event["passages"]:
                passage["text"] = f"{passage['text']} {n} {LONG}"
            if n % 5 == 0:
                event["gold_passage_ids"] = ["d9"]  # a gold passage never retrieved: a miss
            events.append(event)
        answer = client.post("/v1/events/batch", json={"events": events})
        assert answer.status_code == 200
        assert answer.json()["accepted"] == len(events)
    engine = client.app.state.rm.runtime.engine  # type: ignore[attr-defined]
    for n in range(start, start + count):
        judge(engine, f"read-{n}", [n % 4, 1, 0, 2])


def peaks(client: TestClient, seconds: dict[str, float] | None = None) -> dict[str, int]:
    """Peak bytes allocated while each GET route answers (and, into ``seconds``, how long it
    took: printed, never asserted, as a shared machine's timings decide nothing)."""
    out: dict[str, int] = {}
    for route in every_route(client.app):  # type: ignore[arg-type]
        if route.method != "GET":
            continue
        url = route.url(event_id="read-0", name="app.css")
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        started = time.perf_counter()
        answer = client.get(url, params=PARAMETERS.get(route.path), follow_redirects=True)
        if seconds is not None:
            seconds[route.path] = time.perf_counter() - started
        out[route.path] = tracemalloc.get_traced_memory()[1] - before
        assert answer.status_code < 500, (route, answer.text[:500])
    return out


@pytest.fixture
def settings(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    # The read limit below both volumes, as a large deployment's windows are above the default.
    return make_settings(tmp_path, store_url, redis_url, max_read_events=READ_LIMIT)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def test_no_read_costs_memory_in_proportion_to_the_volume(client: TestClient) -> None:
    seed(client, 0, SMALL)
    small_seconds: dict[str, float] = {}
    large_seconds: dict[str, float] = {}
    tracemalloc.start()
    try:
        peaks(client)  # first answers build what every later one shares (templates, plans)
        small = peaks(client, small_seconds)
        tracemalloc.stop()
        seed(client, SMALL, SMALL * (GROWTH - 1))
        tracemalloc.start()
        peaks(client)
        large = peaks(client, large_seconds)
    finally:
        tracemalloc.stop()
    print(f"\npeak bytes and seconds per read at {SMALL} and {SMALL * GROWTH} events:")
    for path in sorted(small):
        ratio = large[path] / max(small[path], 1)
        print(
            f"  {small[path]:>11,} {large[path]:>11,}  {ratio:5.1f}x  "
            f"{small_seconds[path]:6.3f} {large_seconds[path]:6.3f} s  {path}"
        )
    growing = {
        path: (small[path], large[path])
        for path in small
        if large[path] > ALLOWED_FACTOR * small[path] + SLACK_BYTES
    }
    assert not growing, f"reads that grow with the volume: {growing}"
