"""The judge queue on a broker of its own (``RM_BROKER_URL``): what sending a judge message costs
on each broker, and what it does to ingest.

Two parts, each side by side in one run, in alternating order:

- the send alone, in this process: ``JudgeQueue.push`` of a 16-event slice, CPU per message,
  (a) on Redis as the API sends it (the message written by hand, one LPUSH), (b) on Redis through
  Celery's own publishing (what (a) replaced), (c) on RabbitMQ through Celery's own publishing
  (what the API does there);
- the API: batches of 100 events and single events posted to ``serve``'s app on a SQLite file,
  with the judge queue on the bench's Redis, then on RabbitMQ: events stored/s and API CPU per
  stored event (from /proc), the Redis run as the baseline.

Run: ``python -m tests.benchmarks.bench_broker`` (``--help`` for the knobs). RabbitMQ is the
one at ``RM_BENCH_RABBITMQ_URL`` (default amqp://guest:guest@127.0.0.1:5672//).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import redis

from service.ingest.judge_queue import JudgeQueue
from service.queue.broker import BrokerQueues
from service.queue.celery_sender import celery_sender
from service.queue.tasks import JUDGE_SLICE_TASK
from tests.benchmarks.bench_ingest import batch_bodies, event, post_batches, post_bodies, store
from tests.benchmarks.common import (
    REDIS_URL,
    Figure,
    api_command,
    count_events,
    cpu_seconds,
    free_port,
    median_figure,
    run_benchmark,
    running,
    service_env,
)

RABBITMQ_URL = os.environ.get("RM_BENCH_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")
SLICE = list(range(16))


def _drop(broker_url: str, queue: str) -> None:
    queues = BrokerQueues(broker_url)
    if queues.redis is not None:
        queues.redis.delete(queue)
        return
    from kombu.connection import Connection

    connect: Any = Connection  # kombu has no type hints
    with connect(broker_url) as connection:
        connection.default_channel.queue_delete(queue)


def _cpu_per_send(broker_url: str, sends: int, send: Callable[[str], object]) -> float:
    """Milliseconds of this process's CPU per ``send(queue)``, after one to connect."""
    queue = f"bench-broker-{uuid.uuid4().hex[:6]}"
    try:
        send(queue)
        started = time.process_time()
        for _ in range(sends):
            send(queue)
        return 1000 * (time.process_time() - started) / sends
    finally:
        _drop(broker_url, queue)


def _hand_written(url: str) -> Callable[[str], object]:
    senders: dict[str, JudgeQueue] = {}

    def send(queue: str) -> object:
        if queue not in senders:  # one sender per run, as an API process holds one
            senders[queue] = JudgeQueue(url, queue)
        return senders[queue].push(SLICE)

    return send


def _celerys(url: str) -> Callable[[str], object]:
    sender = celery_sender(url)

    def send(queue: str) -> object:
        return sender.send_task(JUDGE_SLICE_TASK, args=[SLICE], queue=queue)

    return send


def measure_sends(sends: int, repeat: int) -> list[Figure]:
    ways = {
        "redis, hand-written": (REDIS_URL, _hand_written(REDIS_URL)),
        "redis, Celery": (REDIS_URL, _celerys(REDIS_URL)),
        "rabbitmq, Celery": (RABBITMQ_URL, _hand_written(RABBITMQ_URL)),
    }
    found: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeat):
        for name, (url, send) in ways.items():
            found[name].append(_cpu_per_send(url, sends, send))
    base = found["redis, hand-written"]
    return [
        median_figure(
            12,
            f"judge message of 16 events, {name}, CPU per message",
            found[name],
            "ms",
            "redis, hand-written LPUSH",
            base,
            target="reported",
            note=f"{sends} sends per run",
        )
        for name in ("rabbitmq, Celery", "redis, Celery")
    ]


def post_singles(url: str, count: int, run: str) -> float:
    """Seconds to post ``count`` single events with four clients."""
    return post_bodies(
        url, [orjson.dumps(event(i, run)) for i in range(count)], "/v1/events", 202, 4
    )


def measure_api(batches: int, singles: int, repeat: int) -> list[Figure]:
    brokers = {"redis": REDIS_URL, "rabbitmq": RABBITMQ_URL}
    rate: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for r in range(repeat):
            for name, broker in brokers.items():
                redis.Redis.from_url(REDIS_URL).flushdb()
                queue = f"bench-{uuid.uuid4().hex[:6]}"
                with store("sqlite", Path(folder)) as database_url:
                    port = free_port()
                    url = f"http://127.0.0.1:{port}"
                    env = service_env(database_url, queue, {"RM_BROKER_URL": broker})
                    with running(api_command(port), env, url, "/readyz") as pid:
                        post_batches(url, batch_bodies(2, f"{name}{r}-warm"))
                        for shape in ("batch x100", "single"):
                            before, spent = count_events(database_url), cpu_seconds(pid)
                            if shape == "single":
                                seconds = post_singles(url, singles, f"{name}{r}s")
                            else:
                                seconds = post_batches(url, batch_bodies(batches, f"{name}{r}"))
                            stored = max(1, count_events(database_url) - before)
                            rate.setdefault((name, shape), []).append(stored / seconds)
                            cpu.setdefault((name, shape), []).append(
                                1000 * (cpu_seconds(pid) - spent) / stored
                            )
                _drop(broker, queue)
                _drop(broker, f"{queue}.urgent")
    figures: list[Figure] = []
    for shape in ("batch x100", "single"):
        route = "POST /v1/events/batch x100" if shape != "single" else "POST /v1/events"
        figures += [
            median_figure(
                12,
                f"{route} (sqlite), judge queue on RabbitMQ, events stored/s",
                rate[("rabbitmq", shape)],
                "ev/s",
                "queue on Redis",
                rate[("redis", shape)],
                target="reported",
            ),
            median_figure(
                12,
                f"{route} (sqlite), judge queue on RabbitMQ, API CPU per stored event",
                cpu[("rabbitmq", shape)],
                "ms",
                "queue on Redis",
                cpu[("redis", shape)],
                target="reported",
            ),
        ]
    return figures


def measure(args: argparse.Namespace) -> list[Figure]:
    return measure_sends(args.sends, args.repeat) + measure_api(
        args.batches, args.singles, args.repeat
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sends", type=int, default=2000, help="messages per send run")
    parser.add_argument("--batches", type=int, default=50, help="batches of 100 per API run")
    parser.add_argument("--singles", type=int, default=2000, help="single events per API run")
    parser.add_argument("--repeat", type=int, default=3)


def main(argv: list[str] | None = None) -> int:
    return run_benchmark(__doc__, add_arguments, measure, argv)


if __name__ == "__main__":
    sys.exit(main())
