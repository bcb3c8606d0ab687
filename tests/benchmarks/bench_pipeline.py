"""Ingest and judging throughput of the pipeline on this machine.

Starts the real API (``retrieval-monitor serve --no-worker``, SQLite file, the Redis at
RM_TEST_REDIS_URL or 127.0.0.1:6379/14) and the OpenAI-compatible test server, then measures:

- events/s stored by ``POST /v1/events`` (one event per request, k=10 passages of ~150 words),
  driven by several client threads;
- events/s stored by ``POST /v1/events/batch`` with 100 events per request;
- judged events/s of one worker (2 processes) draining that backlog while the judge answers at
  once.

Each figure is the median of ``--repeat`` runs. It prints a table and one JSON line; it asserts
nothing. Run: ``python -m tests.benchmarks.bench_pipeline``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import redis

from tests.benchmarks.bench_local_judge import synthetic_passages

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("RM_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
PASSAGES = synthetic_passages(200, 150)


def event(i: int, run: str) -> dict[str, Any]:
    start = (i * 7) % 190
    return {
        "event_id": f"{run}-{i}",
        "app": "bench",
        "retriever": "r1",
        "query": f"question number {i} about retrieval quality",
        "passages": [{"id": f"p{j}", "text": PASSAGES[start + j]} for j in range(10)],
        "k": 10,
    }


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def start_api(env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--no-worker", "--port", str(port)],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise RuntimeError("API did not start")


def single_events(url: str, seconds: float, threads: int, run: str) -> float:
    counter = iter(range(10**9))
    lock = threading.Lock()
    stored = 0
    stop = time.monotonic() + seconds

    def client() -> None:
        nonlocal stored
        with httpx.Client(base_url=url, timeout=30) as http:
            while time.monotonic() < stop:
                with lock:
                    i = next(counter)
                if http.post("/v1/events", json=event(i, run)).status_code == 202:
                    with lock:
                        stored += 1

    started = time.monotonic()
    workers = [threading.Thread(target=client) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return stored / (time.monotonic() - started)


def batches(url: str, count: int, size: int, run: str) -> float:
    bodies = [{"events": [event(b * size + i, run) for i in range(size)]} for b in range(count)]
    stored = 0
    with httpx.Client(base_url=url, timeout=60) as http:
        started = time.monotonic()
        for body in bodies:
            stored += http.post("/v1/events/batch", json=body).json()["accepted"]
        return stored / (time.monotonic() - started)


def judged_total(url: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if family.name == "retrieval_monitor_events_judged":
            total += sum(s.value for s in family.samples if s.name.endswith("_total"))
    return total


def drain(url: str, env: dict[str, str], backlog: int) -> float:
    from service.config.settings import Settings
    from service.process.worker import worker_command

    settings = Settings(redis_url=env["RM_REDIS_URL"], queue_name=env["RM_QUEUE_NAME"])
    worker = subprocess.Popen(
        worker_command(2, False, settings),
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        # Time from the first judgment, so the worker's start-up is not counted.
        while judged_total(url) == 0:
            time.sleep(0.05)
        started, first = time.monotonic(), judged_total(url)
        while judged_total(url) < backlog:
            time.sleep(0.2)
        return (backlog - first) / (time.monotonic() - started)
    finally:
        worker.terminate()
        worker.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of a single run")
    parser.add_argument("--threads", type=int, default=8, help="client threads for singles")
    parser.add_argument("--batches", type=int, default=30, help="batch requests per run")
    parser.add_argument("--repeat", type=int, default=3, help="runs per figure (median)")
    args = parser.parse_args(argv)

    from tests.support.fake_llm.fixture import running_fake_llm

    figures: dict[str, list[float]] = {"single": [], "batch": [], "judged": []}
    with tempfile.TemporaryDirectory() as tmp, running_fake_llm() as llm:
        for repeat in range(args.repeat):
            redis.Redis.from_url(REDIS_URL).flushdb()
            port = free_port()
            env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
            env.update(
                {
                    "RM_DATABASE_URL": f"sqlite:///{tmp}/bench-{repeat}.db",
                    "RM_REDIS_URL": REDIS_URL,
                    "RM_QUEUE_NAME": f"bench-{uuid.uuid4().hex[:6]}",
                    "RM_JUDGE_BASE_URL": llm.base_url,
                    "RM_JUDGE_MODEL": "bench",
                    "RM_LOG_LEVEL": "WARNING",
                    "PYTHONPATH": str(REPO),
                }
            )
            api = start_api(env, port)
            url = f"http://127.0.0.1:{port}"
            try:
                run = f"r{repeat}"
                figures["single"].append(single_events(url, args.seconds, args.threads, run))
                figures["batch"].append(batches(url, args.batches, 100, run + "b"))
                figures["judged"].append(drain(url, env, _pending(url)))
            finally:
                api.terminate()
                api.wait(timeout=30)
            print(
                f"run {repeat + 1}/{args.repeat}: "
                + ", ".join(f"{k} {v[-1]:.0f}/s" for k, v in figures.items()),
                file=sys.stderr,
            )
    result = {name: statistics.median(values) for name, values in figures.items()}
    print(f"{'figure':<44}{'median':>10}  (runs: {args.repeat})")
    print(f"{'POST /v1/events, events stored/s':<44}{result['single']:>10.0f}")
    print(f"{'POST /v1/events/batch (100), events stored/s':<44}{result['batch']:>10.0f}")
    print(f"{'judged events/s, 1 worker x 2 processes':<44}{result['judged']:>10.1f}")
    print(json.dumps({"runs": args.repeat, **result}))
    return 0


def _pending(url: str) -> int:
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics").text):
        if family.name == "retrieval_monitor_events_pending":  # one sample per tenant
            return int(sum(sample.value for sample in family.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
