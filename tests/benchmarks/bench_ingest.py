"""Ingest: events stored per second, one per request (wrk) and in batches of 100, and API memory.

For each store (SQLite, PostgreSQL) the real API (``retrieval-monitor serve --no-worker``) is
driven by wrk, each request carrying a new event_id; the baseline is ``bare_app`` (same body,
same models, same server, nothing stored) driven the same way. Throughput counts rows in the
events table, not answers. The p99 latency is measured with each connection paced so the total
is about half the saturated rate. Batches of 100 are posted by a Python client (100 events per
request keep the client far from the bottleneck). Each server's CPU time per event (from /proc)
is printed beside the bare endpoint's: on a shared machine it moves far less with the load than
events/s do. Then the same batches against ``serve --workers 2`` beside ``--workers 1``, with
each event's CPU, Redis and database costs (``bench_processes``). Run:
``python -m tests.benchmarks.bench_ingest``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import redis

from tests.benchmarks import bench_processes
from tests.benchmarks.bench_local_judge import synthetic_passages
from tests.benchmarks.common import (
    REDIS_URL,
    Figure,
    api_command,
    count_events,
    cpu_seconds,
    free_port,
    median_figure,
    postgres_database,
    rss_mib,
    run_benchmark,
    running,
    service_env,
)

PASSAGES = synthetic_passages(200, 150)
WRK_SCRIPT = Path(__file__).with_name("wrk_events.lua")


def event(i: int, run: str, k: int = 10, unique: bool = False) -> dict[str, Any]:
    start = (i * 7) % (len(PASSAGES) - k)
    # Passages come from a pool of 200 texts, as a corpus's popular chunks recur; ``unique``
    # makes every passage text new (a first word of its own), so no per-text cache can help.
    texts = [
        f"{run}x{i}x{j} {PASSAGES[start + j]}" if unique else PASSAGES[start + j] for j in range(k)
    ]
    return {
        "event_id": f"{run}-{i}",
        "app": "bench",
        "retriever": "r1",
        # The run in the query keeps (query, passage) pairs new across runs: no label cache hits.
        "query": f"question {run} number {i} about retrieval quality",
        "passages": [{"id": f"p{j}", "text": text} for j, text in enumerate(texts)],
        "k": k,
    }


def run_wrk(
    url: str, body_file: Path, seconds: float, connections: int, run: str, delay_ms: float = 0
) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed: run scripts/install-bench-tools.sh")
    env = {
        **os.environ,
        "BENCH_BODY": str(body_file),
        "BENCH_RUN": run,
        "BENCH_DELAY_MS": str(int(delay_ms)),
    }
    # One wrk thread: wrk in C uses a fraction of a core at these rates, leaving the rest to
    # the server (two cores in all).
    out = subprocess.run(
        [
            wrk,
            "-t1",
            f"-c{connections}",
            f"-d{seconds:g}s",
            "--timeout",
            "10s",
            "-s",
            str(WRK_SCRIPT),
            f"{url}/v1/events",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = [x for x in out.splitlines() if x.startswith("{")][-1]
    result: dict[str, Any] = json.loads(line)
    return result


@contextmanager
def store(kind: str, tmp: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp}/ingest-{uuid.uuid4().hex[:6]}.db"
    else:
        with postgres_database(f"rm_bench_{uuid.uuid4().hex[:8]}") as url:
            yield url


def saturate(
    url: str, database_url: str | None, body: Path, seconds: float, connections: int, run: str
) -> tuple[float, dict[str, Any]]:
    """Events/s stored (or answered 2xx, for the bare endpoint) over one wrk run."""
    before = count_events(database_url) if database_url else 0
    result = run_wrk(url, body, seconds, connections, run)
    elapsed = result["duration_us"] / 1e6
    if database_url:
        done = count_events(database_url) - before
    else:
        done = result["requests"] - result["non2xx"]
    return done / elapsed, result


def post_batches(url: str, bodies: list[bytes], threads: int = 2) -> float:
    """Seconds to post every batch body with ``threads`` clients."""
    return post_bodies(url, bodies, "/v1/events/batch", 200, threads)


def post_bodies(url: str, bodies: list[bytes], path: str, answer: int, threads: int) -> float:
    """Seconds to post every body to ``path`` with ``threads`` clients, each answered ``answer``."""
    queue = list(reversed(bodies))
    lock = threading.Lock()
    errors: list[str] = []

    def client() -> None:
        with httpx.Client(base_url=url, timeout=120) as http:
            while True:
                with lock:
                    if not queue:
                        return
                    body = queue.pop()
                got = http.post(path, content=body, headers={"content-type": "application/json"})
                if got.status_code != answer:
                    errors.append(f"{got.status_code} {got.text[:200]}")

    started = time.monotonic()
    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise RuntimeError(f"{path} refused: {errors[0]}")
    return time.monotonic() - started


def batch_bodies(count: int, run: str, unique: bool = False) -> list[bytes]:
    return [
        orjson.dumps({"events": [event(b * 100 + i, run, unique=unique) for i in range(100)]})
        for b in range(count)
    ]


def measure(args: argparse.Namespace) -> list[Figure]:
    figures = [] if args.processes_only else measure_one_process(args)
    if args.workers > 1:
        figures += measure_processes(args)
    return figures


def measure_processes(args: argparse.Namespace) -> list[Figure]:
    """Batches of 100 against ``serve --workers 1`` and ``--workers N`` (bench_processes)."""
    stores = ["sqlite"] + ([] if args.no_postgres else ["postgres"])
    figures: list[Figure] = []

    def bodies(run: str) -> list[bytes]:
        return batch_bodies(args.process_batches, run, args.unique_passages)

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for kind in stores:
            costs = {}
            for workers in (1, args.workers):
                with store(kind, tmp) as database_url:
                    costs[workers] = bench_processes.measure_one(
                        database_url,
                        workers,
                        tmp / f"{kind}-{workers}" / "var",
                        bodies,
                        post_batches,
                        args.repeat,
                        args.clients,
                        count_events,
                    )
            figures += bench_processes.figures_for(
                kind, args.workers, costs[1], costs[args.workers]
            )
    return figures


def measure_one_process(args: argparse.Namespace) -> list[Figure]:
    stores = ["sqlite"] + ([] if args.no_postgres else ["postgres"])
    single: dict[str, list[float]] = {"bare": [], **{s: [] for s in stores}}
    p99: dict[str, list[float]] = {s: [] for s in stores}
    paced_rate: dict[str, list[float]] = {s: [] for s in stores}
    batch: dict[str, list[float]] = {"bare": [], **{s: [] for s in stores}}
    memory: dict[str, float] = {}
    # The server's CPU milliseconds per event stored (or answered, for the bare endpoint).
    cpu_single: dict[str, list[float]] = {"bare": [], **{s: [] for s in stores}}
    cpu_batch: dict[str, list[float]] = {"bare": [], **{s: [] for s in stores}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        body = tmp / "event.json"
        body.write_bytes(orjson.dumps(event(0, "x") | {"event_id": "__EVENT_ID__"}))
        bodies = batch_bodies(args.batches, "b", args.unique_passages)

        port = free_port()
        url = f"http://127.0.0.1:{port}"
        bare = [sys.executable, "-m", "tests.benchmarks.bare_app", str(port)]
        with running(bare, service_env("sqlite://", "unused"), url, "/readyz") as bare_pid:
            if not args.batch_only:
                run_wrk(url, body, 1, args.connections, "warm")
            for r in range(args.repeat):
                if not args.batch_only:
                    spent = cpu_seconds(bare_pid)
                    rate, result = saturate(
                        url, None, body, args.seconds, args.connections, f"bare{r}"
                    )
                    single["bare"].append(rate)
                    answered = max(1, result["requests"] - result["non2xx"])
                    cpu_single["bare"].append(1000 * (cpu_seconds(bare_pid) - spent) / answered)
                spent = cpu_seconds(bare_pid)
                batch["bare"].append(100 * len(bodies) / post_batches(url, bodies))
                cpu_batch["bare"].append(
                    1000 * (cpu_seconds(bare_pid) - spent) / (100 * len(bodies))
                )

        for kind in stores:
            redis.Redis.from_url(REDIS_URL).flushdb()
            with store(kind, tmp) as database_url:
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                env = service_env(database_url, f"bench-{uuid.uuid4().hex[:6]}")
                with running(api_command(port), env, url, "/readyz") as pid:
                    idle = rss_mib(pid)
                    if args.batch_only:
                        post_batches(url, batch_bodies(2, f"{kind}-warm"))
                    else:
                        run_wrk(url, body, 1, args.connections, f"{kind}-warm")
                    for r in range(args.repeat if not args.batch_only else 0):
                        spent, before = cpu_seconds(pid), count_events(database_url)
                        rate, _ = saturate(
                            url, database_url, body, args.seconds, args.connections, f"{kind}{r}"
                        )
                        single[kind].append(rate)
                        stored = max(1, count_events(database_url) - before)
                        cpu_single[kind].append(1000 * (cpu_seconds(pid) - spent) / stored)
                    saturated = rss_mib(pid)
                    half = max(1.0, sum(single[kind]) / max(1, len(single[kind])) / 2)
                    for r in range(args.repeat if not args.batch_only else 0):
                        before = count_events(database_url)
                        paced = run_wrk(
                            url,
                            body,
                            args.seconds,
                            args.connections,
                            f"{kind}p{r}",
                            delay_ms=1000 * args.connections / half,
                        )
                        stored = count_events(database_url) - before
                        paced_rate[kind].append(stored / (paced["duration_us"] / 1e6))
                        p99[kind].append(paced["p99_us"] / 1000)
                    for r in range(args.repeat):
                        tagged = batch_bodies(args.batches, f"{kind}b{r}", args.unique_passages)
                        before, spent = count_events(database_url), cpu_seconds(pid)
                        seconds = post_batches(url, tagged)
                        stored = count_events(database_url) - before
                        batch[kind].append(stored / seconds)
                        cpu_batch[kind].append(1000 * (cpu_seconds(pid) - spent) / max(1, stored))
                    if kind == "sqlite" and not args.batch_only:
                        memory.update(fill(url, database_url, args.memory_events))
                        memory["idle"] = idle
                        memory["saturated"] = saturated
                        memory["after"] = rss_mib(pid)
                        memory["events"] = count_events(database_url)

    figures: list[Figure] = []
    for kind in stores if not args.batch_only else []:
        figures.append(
            median_figure(
                1,
                f"POST /v1/events ({kind}), events stored/s",
                single[kind],
                "ev/s",
                "bare endpoint",
                single["bare"],
                ">= 0.60x baseline",
            )
        )
        figures.append(
            median_figure(
                1,
                f"POST /v1/events ({kind}), p99 at ~half saturation",
                p99[kind],
                "ms",
                target="< 50 ms",
                note=f"paced at {sum(paced_rate[kind]) / max(1, len(paced_rate[kind])):.0f} ev/s",
            )
        )
    for kind in stores:
        figures.append(
            median_figure(
                2,
                f"POST /v1/events/batch x100 ({kind}), events stored/s"
                + (", every passage new" if args.unique_passages else ""),
                batch[kind],
                "ev/s",
                "bare batch endpoint",
                batch["bare"],
                ">= 0.50x baseline",
            )
        )
    for kind in stores:
        for path, cpu, bound in (("", cpu_single, "1.67x"), ("/batch x100", cpu_batch, "2.00x")):
            if not cpu[kind]:
                continue
            figures.append(
                median_figure(
                    1 if not path else 2,
                    f"POST /v1/events{path} ({kind}), API CPU per stored event",
                    cpu[kind],
                    "ms",
                    "bare endpoint, CPU per event",
                    cpu["bare"],
                    # The CPU share that leaves 0.6x (single) or 0.5x (batch) of the bare
                    # endpoint's throughput on the same cores.
                    f"<= {bound} baseline",
                )
            )
    if memory:
        figures.append(
            Figure(
                7,
                "API RSS under saturation (sqlite)",
                memory["saturated"],
                "MiB",
                "idle after start",
                memory["idle"],
                target="bounded",
            )
        )
        figures.append(
            Figure(
                7,
                f"API RSS after {int(memory['events']):,} events stored (sqlite)",
                memory["after"],
                "MiB",
                "idle after start",
                memory["idle"],
                target="bounded",
            )
        )
    return figures


def fill(url: str, database_url: str, total: int) -> dict[str, float]:
    """Post batches until ``total`` events are stored, for the memory figure."""
    chunk = 20
    round_number = 0
    while count_events(database_url) < total:
        missing = total - count_events(database_url)
        count = min(chunk, max(1, -(-missing // 100)))
        post_batches(url, batch_bodies(count, f"fill{round_number}"))
        round_number += 1
    return {}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=10.0, help="length of one wrk run")
    parser.add_argument("--connections", type=int, default=16, help="wrk connections")
    parser.add_argument("--batches", type=int, default=20, help="batch requests per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    parser.add_argument("--memory-events", type=int, default=100_000)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument(
        "--batch-only",
        action="store_true",
        help="only the batch figure (2): no wrk runs, no memory figure",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="also post batches to serve --workers N beside --workers 1 (1: skip)",
    )
    parser.add_argument(
        "--processes-only",
        action="store_true",
        help="only the --workers runs and their per-event costs (bench_processes)",
    )
    parser.add_argument(
        "--process-batches", type=int, default=60, help="batches of 100 per --workers run"
    )
    parser.add_argument("--clients", type=int, default=4, help="client threads of a --workers run")
    parser.add_argument(
        "--unique-passages",
        action="store_true",
        help="batches whose every passage text is new (default: drawn from 200 texts)",
    )


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
