"""Every read's work in PostgreSQL follows what it shows, not how much history the database holds.

Each GET route of the application (read from ``app.routes``) is answered over a database of
``SMALL`` judged events and again over ten times as many, all in the window the route shows by
default, with no planner statistics (as a bulk load or a new day partition leaves them). Every
SELECT a route sends is planned and run again under ``EXPLAIN (ANALYZE, BUFFERS)`` and the rows
its scans touch are added up (``tests/support/plan_work.py``): a figure of the data walked, which
a shared machine's load does not move. A route whose rows grow with the volume fails.

``STILL_GROWING`` names the reads not yet bounded this way; the test fails too when one of them
stops growing, so the list only ever shrinks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from service.analysis.gauges import _CachedGauges
from service.api.app import create_app
from service.config.settings import Settings
from service.primitives.clock import utcnow
from tests.support.environment import make_settings
from tests.support.history import event_id, fill
from tests.support.plan_work import forget_statistics, recording, rows_read, statement_log
from tests.support.routes import every_route

SMALL = 2_000
READ_LIMIT = 500
GROWTH = 10
# Rows a read may touch besides a share that follows what it shows: an index's upper pages, a
# window's few buckets, a bounded page's rows.
ALLOWED_FACTOR = 2.0
SLACK_ROWS = 2_000
PARAMETERS = {"/v1/analysis/compare": {"baseline": "previous"}}
# Reads whose work still follows the window's events (each named with what it walks).
STILL_GROWING: dict[str, str] = {
    "/ui": "the overview's counts and per-judge series over every event of the window",
    "/ui/login": "answered by the overview when no login is configured",
    "/ui/events": "the list's exact total over the window",
    "/ui/label": "the label pool drawn by sorting the window",
    "/ui/misses": "the cause counts, checking gold once per event",
    "/ui/misses/{event_id}": "the next unclassified miss, walking the window",
    "/v1/misses/causes": "the cause counts, checking gold once per event",
    "/v1/analysis": "the analysis's inputs, read per event of the window",
    "/v1/analysis/compare": "both windows' inputs, read per event",
    "/v1/calibration/local-judge": "the gold events' grades, read per event of the window",
    "/v1/gold/agreement": "every labelled event of the window and its labels",
    "/metrics": "the labeller-agreement gauges, over every labelled event of a week",
}


@pytest.fixture
def settings(tmp_path: Path, postgres_url: str, redis_url: str) -> Settings:
    # The read limit below both volumes, as a large deployment's windows are above its default.
    return make_settings(tmp_path, postgres_url, redis_url, max_read_events=READ_LIMIT)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as test_client:
        yield test_client


def expire_cached_gauges(client: TestClient) -> None:
    """The gauges /metrics reads from the database are cached for a minute: each scrape here
    reads them again, as the first scrape after the cache lapses does."""
    state = client.app.state.rm  # type: ignore[attr-defined]
    for collector in state.metrics_page.collectors:
        if isinstance(collector, _CachedGauges):
            collector.expire()


def work(client: TestClient, engine: Engine) -> dict[str, int]:
    """Rows touched by each GET route's statements."""
    out: dict[str, int] = {}
    with statement_log(engine) as log:
        for route in every_route(client.app):  # type: ignore[arg-type]
            if route.method != "GET":
                continue
            url = route.url(event_id=event_id(5), name="app.css")
            expire_cached_gauges(client)
            with recording(log) as statements:
                answer = client.get(url, params=PARAMETERS.get(route.path), follow_redirects=True)
            assert answer.status_code < 500, (route, answer.text[:500])
            out[route.path] = rows_read(engine, statements)
    return out


def test_no_read_works_in_proportion_to_the_history(client: TestClient) -> None:
    engine: Engine = client.app.state.rm.runtime.engine  # type: ignore[attr-defined]
    now = utcnow()
    fill(engine, 0, SMALL, now)
    forget_statistics(engine)
    work(client, engine)  # first answers build what later ones share
    small = work(client, engine)
    fill(engine, SMALL, SMALL * (GROWTH - 1), now)
    forget_statistics(engine)
    large = work(client, engine)
    print(f"\nrows read per route at {SMALL:,} and {SMALL * GROWTH:,} events:")
    for path in sorted(small):
        ratio = large[path] / max(small[path], 1)
        print(f"  {small[path]:>10,} {large[path]:>10,}  {ratio:6.1f}x  {path}")
    growing = {path for path in small if large[path] > ALLOWED_FACTOR * small[path] + SLACK_ROWS}
    assert growing - set(STILL_GROWING) == set(), {
        path: (small[path], large[path]) for path in growing - set(STILL_GROWING)
    }
    assert set(STILL_GROWING) - growing == set(), "bounded now: take them off STILL_GROWING"
