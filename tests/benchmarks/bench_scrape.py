"""Scrape: time of GET /metrics with 20 apps x 5 retrievers and every measure populated.

The shared aggregates in Redis (database 10) are filled the way workers fill them (one Delta per
app and retriever with every measure observed, plus the event and judge counters), then the real
API is scraped; the baseline is GET /healthz on the same server (the HTTP round trip alone).
``--earlier N`` first stores N judged events in the SQLite database and rebuilds the aggregates
from them (``earlier_events``, as ``bench_lag`` does), so Redis holds their once-only export
markers and the windows of the gauges read from the database hold them: a scrape whose work grows
with the events shows it there. The first scrape after the start, which reads those gauges from
the database (then cached for a minute), is a figure of its own.
Run: ``python -m tests.benchmarks.bench_scrape [--earlier N]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import redis

from tests.benchmarks import earlier_events
from tests.benchmarks.common import (
    REDIS_URL,
    Figure,
    api_command,
    free_port,
    run_benchmark,
    running,
    service_env,
)


def fill(apps: int, retrievers: int) -> int:
    """Write the aggregates; returns how many series /metrics will carry for them."""
    from service.telemetry.aggregates import Aggregates, Delta
    from service.telemetry.metrics import MEASURE_BUCKETS

    aggregates = Aggregates(redis.Redis.from_url(REDIS_URL))
    for a in range(apps):
        for r in range(retrievers):
            labels = {
                "app": f"app-{a}",
                "retriever": f"retriever-{r}",
                "environment": "prod",
                "judge": "bench",
                "prompt_version": "v2",
            }
            delta = Delta()
            for family in ("events_judged",):
                delta.inc(family, labels, 10)
            short = {k: labels[k] for k in ("app", "retriever", "environment")}
            for family in ("events_accepted", "events_duplicate"):
                delta.inc(family, short, 10)
            for measure in MEASURE_BUCKETS:
                for value in (0.0, 0.3, 0.7, 1.0):
                    delta.observe(f"measure_{measure}", labels, value)
            delta.observe("pipeline_lag_seconds", {"app": labels["app"]}, 0.5)
            aggregates.force_add(delta)
    return apps * retrievers * len(MEASURE_BUCKETS)


def timed_gets(http: httpx.Client, path: str, count: int) -> tuple[float, int]:
    """Median milliseconds of ``count`` GETs, and the size of the last body."""
    times = []
    size = 0
    for _ in range(count):
        started = time.perf_counter()
        answer = http.get(path)
        times.append(1000 * (time.perf_counter() - started))
        answer.raise_for_status()
        size = len(answer.content)
    return statistics.median(times), size


def measure(args: argparse.Namespace) -> list[Figure]:
    scrapes: list[float] = []
    health: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        redis.Redis.from_url(REDIS_URL).flushdb()
        database_url = f"sqlite:///{Path(tmp) / 'scrape.db'}"
        if args.earlier:
            seconds = earlier_events.fill(database_url, args.earlier)
            seconds += earlier_events.export(database_url, Path(tmp))
            print(f"[scrape] {args.earlier:,} earlier events in {seconds:.0f} s", file=sys.stderr)
        env = service_env(database_url, f"b-{uuid.uuid4().hex[:6]}")
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with running(api_command(port), env, url, "/readyz"):
            histograms = fill(args.apps, args.retrievers)
            with httpx.Client(base_url=url, timeout=30) as http:
                first, _ = timed_gets(http, "/metrics", 1)
                first_health, _ = timed_gets(http, "/healthz", 1)
                size = 0
                for _ in range(args.repeat):
                    value, size = timed_gets(http, "/metrics", args.scrapes)
                    scrapes.append(value)
                    health.append(timed_gets(http, "/healthz", args.scrapes)[0])
    where = f"{args.apps} apps x {args.retrievers} retrievers x every measure"
    if args.earlier:
        where += f", {args.earlier:,} earlier events"
    figures = [
        Figure(
            6,
            f"GET /metrics, {where}",
            statistics.median(scrapes),
            "ms",
            "GET /healthz",
            statistics.median(health),
            runs=len(scrapes),
            target="< 50 ms",
            note=f"{histograms} measure histograms, {size / 1024:,.0f} KiB, "
            f"each run the median of {args.scrapes} scrapes",
            samples=[round(s, 2) for s in scrapes],
        )
    ]
    if args.earlier:
        figures.append(
            Figure(
                6,
                f"first GET /metrics after the start (gauges read from the database), {where}",
                first,
                "ms",
                "GET /healthz",
                first_health,
                runs=1,
                target="reported",
            )
        )
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--apps", type=int, default=20)
    parser.add_argument("--retrievers", type=int, default=5)
    parser.add_argument("--scrapes", type=int, default=10, help="scrapes per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--earlier",
        type=int,
        default=0,
        help="judged events stored (and their aggregates rebuilt) before the API starts",
    )


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
