"""Judging: judged events/s per worker process, ingest-to-export lag at a steady rate, the cache.

The real API (SQLite file, Redis database 10) and real Celery worker processes judge k=10 events
against the test's OpenAI-compatible server, which answers at once. Figures:

- judged events/s of one worker process draining a backlog, timed from its first judgment; the
  baseline is how many chat calls/s that server answers to one plain client (the ceiling any
  worker process could reach);
- p50 and p95 of ``retrieval_monitor_pipeline_lag_seconds`` (receipt to the measures' export)
  while events arrive at a steady rate (default 100/s) with a worker of 2 processes; the
  baseline is the judge call latency observed in the same window;
- prompt tokens spent on events that repeat earlier (query, passage) pairs: the label cache
  should make them free.

Run: ``python -m tests.benchmarks.bench_judging``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx
import orjson
import redis

from tests.benchmarks.bench_ingest import event
from tests.benchmarks.common import (
    REDIS_URL,
    REPO,
    Figure,
    api_command,
    free_port,
    median_figure,
    rss_mib,
    run_benchmark,
    running,
    service_env,
)
from tests.benchmarks.metrics_reader import counter_total, histogram_buckets, quantile

JUDGED = "retrieval_monitor_events_judged"


def start_worker(env: dict[str, str], processes: int) -> subprocess.Popen[bytes]:
    from service.config.settings import Settings
    from service.process.worker import worker_command

    settings = Settings(redis_url=env["RM_REDIS_URL"], queue_name=env["RM_QUEUE_NAME"])
    return subprocess.Popen(
        worker_command(processes, False, settings),
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def post_events(url: str, events: list[dict[str, object]]) -> None:
    with httpx.Client(base_url=url, timeout=120) as http:
        for start in range(0, len(events), 100):
            answer = http.post(
                "/v1/events/batch",
                content=orjson.dumps({"events": events[start : start + 100]}),
                headers={"content-type": "application/json"},
            )
            answer.raise_for_status()


def wait_judged(url: str, target: float, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while (judged := counter_total(url, JUDGED)) < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"judged {judged:.0f} of {target:.0f} within {timeout:.0f} s")
        time.sleep(0.1)
    return judged


def drain_rate(url: str, env: dict[str, str], backlog: int, run: str) -> tuple[float, float]:
    """Judged events/s of one worker process over a backlog; also its RSS at the end (MiB)."""
    start_count = counter_total(url, JUDGED)
    post_events(url, [event(i, run) for i in range(backlog)])
    worker = start_worker(env, 1)
    try:
        # From the first judgment, so Celery's start-up is not counted.
        first = wait_judged(url, start_count + 1, 120)
        started = time.monotonic()
        wait_judged(url, start_count + backlog, 600)
        rate = (start_count + backlog - first) / (time.monotonic() - started)
        return rate, rss_mib(worker.pid)
    finally:
        stop(worker)


def raw_judge_rate(base_url: str, seconds: float) -> float:
    """Chat calls/s the test server answers to one client sending the judge's own messages."""
    from workers.judge.prompt import JudgeRequest, response_format, system_message, user_message

    sample = event(0, "raw")
    texts = tuple(str(p["text"]) for p in sample["passages"])
    request = JudgeRequest(str(sample["query"]), texts, rate_context=True, top_k_count=10)
    body = {
        "model": "bench",
        "messages": [
            {"role": "system", "content": system_message(request)},
            {"role": "user", "content": user_message(request)},
        ],
        "response_format": response_format(request),
    }
    calls = 0
    with httpx.Client(base_url=base_url, timeout=30) as http:
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            http.post("/chat/completions", json=body).raise_for_status()
            calls += 1
        return calls / (time.monotonic() - started)


def steady_lag(url: str, rate: float, seconds: float, run: str) -> tuple[float, float, float]:
    """Post single events at ``rate``/s; lag p50, p95 and the achieved rate."""
    lag_before = histogram_buckets(url, "retrieval_monitor_pipeline_lag_seconds")
    judged_before = counter_total(url, JUDGED)
    count = int(rate * seconds)
    threads = 4
    sent = [0]
    lock = threading.Lock()
    started = time.monotonic()

    def client(offset: int) -> None:
        with httpx.Client(base_url=url, timeout=30) as http:
            for i in range(offset, count, threads):
                # Each event has its moment; a late client catches up rather than drifting.
                pause = started + i / rate - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                answer = http.post(
                    "/v1/events",
                    content=orjson.dumps(event(i, run)),
                    headers={"content-type": "application/json"},
                )
                if answer.status_code == 202:
                    with lock:
                        sent[0] += 1

    workers = [threading.Thread(target=client, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    achieved = sent[0] / (time.monotonic() - started)
    wait_judged(url, judged_before + sent[0], 300)
    lag_after = histogram_buckets(url, "retrieval_monitor_pipeline_lag_seconds")
    return (
        quantile(0.5, lag_before, lag_after) or float("nan"),
        quantile(0.95, lag_before, lag_after) or float("nan"),
        achieved,
    )


def measure(args: argparse.Namespace) -> list[Figure]:
    from tests.support.fake_llm.fixture import running_fake_llm

    rates: list[float] = []
    raw: list[float] = []
    p50: list[float] = []
    p95: list[float] = []
    achieved: list[float] = []
    judge_p95: list[float] = []
    worker_rss: list[float] = []
    steady_rss: list[float] = []
    repeat_tokens = 0.0
    repeat_passages = 0
    with tempfile.TemporaryDirectory() as tmp, running_fake_llm() as llm:
        redis.Redis.from_url(REDIS_URL).flushdb()
        database_url = f"sqlite:///{Path(tmp) / 'judging.db'}"
        env = service_env(
            database_url,
            f"bench-{uuid.uuid4().hex[:6]}",
            {"RM_JUDGE_BASE_URL": llm.base_url, "RM_JUDGE_MODEL": "bench"},
        )
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with running(api_command(port), env, url, "/readyz"):
            for r in range(args.repeat):
                raw.append(raw_judge_rate(llm.base_url, args.raw_seconds))
                rate, rss = drain_rate(url, env, args.backlog, f"d{r}")
                rates.append(rate)
                worker_rss.append(rss)

            # The cache: the same (query, passage) pairs as the first drain, new event ids.
            tokens_before = counter_total(url, "retrieval_monitor_judge_tokens", kind="prompt")
            repeats = [event(i, "d0") | {"event_id": f"again-{i}"} for i in range(args.backlog)]
            judged_before = counter_total(url, JUDGED)
            post_events(url, repeats)
            worker = start_worker(env, 2)
            try:
                wait_judged(url, judged_before + len(repeats), 300)
                repeat_tokens = (
                    counter_total(url, "retrieval_monitor_judge_tokens", kind="prompt")
                    - tokens_before
                )
                repeat_passages = 10 * len(repeats)
                for r in range(args.repeat):
                    judge_before = histogram_buckets(url, "retrieval_monitor_judge_latency_seconds")
                    low, high, got = steady_lag(url, args.rate, args.lag_seconds, f"s{r}")
                    p50.append(low)
                    p95.append(high)
                    achieved.append(got)
                    judge_after = histogram_buckets(url, "retrieval_monitor_judge_latency_seconds")
                    judge_p95.append(quantile(0.95, judge_before, judge_after) or float("nan"))
                steady_rss.append(rss_mib(worker.pid))
            finally:
                stop(worker)

    steady = f"at {sum(achieved) / max(1, len(achieved)):.0f} ev/s sent, worker x2 processes"
    return [
        median_figure(
            4,
            "judged events/s, 1 worker process (k=10)",
            rates,
            "ev/s",
            "test judge server, calls/s to 1 client",
            raw,
            ">= 200 ev/s",
        ),
        median_figure(
            4,
            "ingest-to-export lag p50",
            p50,
            "s",
            "judge call p95",
            judge_p95,
            note=steady,
        ),
        median_figure(
            4,
            "ingest-to-export lag p95",
            p95,
            "s",
            "judge call p95",
            judge_p95,
            "< 2 s",
            note=steady,
        ),
        Figure(
            3,
            "judge prompt tokens/passage for repeated (query, passage) pairs",
            repeat_tokens / max(1, repeat_passages),
            "tok",
            runs=1,
            target="0 (cache)",
            note=f"{repeat_passages // 10} repeated events",
        ),
        median_figure(
            7,
            f"worker RSS, 1 process, after draining {args.backlog} events",
            worker_rss,
            "MiB",
            target="bounded",
            note="Celery main process + 1 child",
        ),
        median_figure(
            7,
            "worker RSS, 2 processes, after the steady runs",
            steady_rss,
            "MiB",
            target="bounded",
            note="Celery main process + 2 children, at saturation if behind",
        ),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backlog", type=int, default=1000, help="events per drain run")
    parser.add_argument("--rate", type=float, default=100.0, help="steady events/s for the lag")
    parser.add_argument("--lag-seconds", type=float, default=20.0)
    parser.add_argument("--raw-seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
