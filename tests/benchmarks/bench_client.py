"""The client library's cost to the application: the time one ``record()`` call takes.

An application thread records ``--events`` retrievals (10 passages of ~100 words each) in a
tight loop, each call timed on its own, while the client's sender thread batches and sends them
to a real API process (SQLite, Redis database 10); then again with nothing listening at the URL,
so the sender retries and, once the queue is full, the calls drop. The baseline is what the
client replaces: the same event sent with a synchronous ``httpx.post`` in the caller's thread.
Run: ``python -m tests.benchmarks.bench_client``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import httpx
from retrieval_monitor_client import MonitorClient

from tests.benchmarks.common import (
    Figure,
    api_command,
    free_port,
    median_figure,
    run_benchmark,
    running,
    service_env,
)

WORDS = [
    "retrieval",
    "passage",
    "about",
    "returns",
    "shipping",
    "refunds",
    "warranty",
    "size",
    "colour",
    "stock",
]
FIGURE = 8


def passages(n: int) -> list[dict[str, object]]:
    return [
        {"id": f"doc-{n}-{rank}", "text": " ".join(WORDS[(n + i) % len(WORDS)] for i in range(100))}
        for rank in range(10)
    ]


def timed_records(monitor: MonitorClient, events: int) -> list[float]:
    """Microseconds of each ``record()`` call, in order."""
    # Built up front: what is timed is the client's work, not the application's.
    bodies = [(f"question number {n}", passages(n)) for n in range(events)]
    clock = time.perf_counter_ns
    costs: list[float] = []
    for query, hits in bodies:
        started = clock()
        monitor.record(query, hits, k=5)
        costs.append((clock() - started) / 1000)
    return costs


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def timed_posts(url: str, count: int) -> list[float]:
    """Microseconds of a synchronous POST /v1/events of the same kind of event."""
    costs: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        for n in range(count):
            event = {
                "event_id": f"post-{uuid.uuid4().hex}",
                "app": "bench-post",
                "retriever": "bm25",
                "query": f"question number {n}",
                "passages": passages(n),
                "k": 5,
            }
            started = time.perf_counter_ns()
            http.post("/v1/events", json=event).raise_for_status()
            costs.append((time.perf_counter_ns() - started) / 1000)
    return costs


def measure(args: argparse.Namespace) -> list[Figure]:
    up_p50: list[float] = []
    up_p99: list[float] = []
    down_p50: list[float] = []
    down_p99: list[float] = []
    post_p50: list[float] = []
    dropped_down: list[int] = []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            env = service_env(f"sqlite:///{Path(tmp) / 'client.db'}", f"b-{uuid.uuid4().hex[:6]}")
            port = free_port()
            url = f"http://127.0.0.1:{port}"
            with running(api_command(port), env, url, "/readyz"):
                post_p50.append(statistics.median(timed_posts(url, args.posts)))
                # Room for every event: the figure is the cost of a kept event, not of a drop.
                monitor = MonitorClient(url, app="bench", retriever="bm25", max_pending=args.events)
                costs = timed_records(monitor, args.events)
                monitor.flush(600)
                monitor.close()
            up_p50.append(percentile(costs, 0.50))
            up_p99.append(percentile(costs, 0.99))

        # Nothing listens: the sender's connections are refused and it keeps retrying.
        monitor = MonitorClient(
            f"http://127.0.0.1:{free_port()}",
            app="bench",
            retriever="bm25",
            max_pending=args.events // 2,
        )
        costs = timed_records(monitor, args.events)
        dropped_down.append(monitor.close(timeout=0).dropped)
        down_p50.append(percentile(costs, 0.50))
        down_p99.append(percentile(costs, 0.99))

    events = f"{args.events} events of 10 passages"
    return [
        median_figure(
            FIGURE,
            "client record() cost to the caller, service up, p50",
            up_p50,
            "us",
            "synchronous httpx POST /v1/events, p50",
            post_p50,
            note=events,
        ),
        median_figure(
            FIGURE,
            "client record() cost to the caller, service up, p99",
            up_p99,
            "us",
            target="< 50 us",
        ),
        median_figure(
            FIGURE,
            "client record() cost to the caller, service down, p50",
            down_p50,
            "us",
            note=f"half kept, half dropped (queue {args.events // 2}); "
            f"dropped {statistics.median(dropped_down):.0f}",
        ),
        median_figure(
            FIGURE,
            "client record() cost to the caller, service down, p99",
            down_p99,
            "us",
            target="< 50 us",
        ),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--events", type=int, default=20_000, help="record() calls per run")
    parser.add_argument("--posts", type=int, default=200, help="baseline POSTs per run")
    parser.add_argument("--repeat", type=int, default=3)


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    raise SystemExit(main())
