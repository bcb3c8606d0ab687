"""Ingest on every core: batches of 100 against ``serve --workers 1`` and ``--workers N``, and what
each stored event costs (the inputs of docs/scaling.md).

Each run starts the real command on embedded defaults for Redis (its own redis-server, so Redis's
own counters see only this run) on a fresh SQLite file or PostgreSQL database, posts batches of
100 from several client threads, and reads before and after:

- events stored (rows, not answers) over the posting time: events/s;
- CPU seconds of serve and every process it started (the API processes), per event;
- Redis: commands executed (INFO commandstats, scripts' own commands included), CPU, and memory
  used, per event;
- the database's size (PostgreSQL: ``pg_total_relation_size`` of every table; SQLite: the file
  and its WAL), per event.

Run: ``python -m tests.benchmarks.bench_ingest --processes-only``. Nothing here asserts a timing.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.benchmarks.common import REPO, Figure, free_port, median_figure
from tests.support.procfs import cpu_seconds, descendants

STARTED = "Application startup complete."


@dataclass
class Serve:
    process: subprocess.Popen[bytes]
    log: Path
    url: str

    def messages(self) -> list[dict[str, Any]]:
        found = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    found.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return found

    def redis(self) -> redis.Redis:
        for message in self.messages():
            if message.get("msg") == "embedded Redis started":
                return redis.Redis.from_url(str(message["url"]))
        raise RuntimeError("serve did not say where its embedded Redis listens")

    def cpu_seconds(self) -> float:
        """User and system CPU of serve and of every process it started that is still running."""
        pids = [self.process.pid, *descendants(self.process.pid)]
        return sum(cpu_seconds(pid) for pid in pids)


@contextmanager
def serve(database_url: str, workers: int, data_dir: Path) -> Iterator[Serve]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
    env.update(
        {
            "RM_DATABASE_URL": database_url,
            "RM_DATA_DIR": str(data_dir),
            "RM_LOG_JSON": "true",
            "RM_LOG_LEVEL": "INFO",  # the processes' start-up lines say when all are serving
            "RM_MAX_PENDING_EVENTS": "100000000",
            "PYTHONPATH": str(REPO),
        }
    )
    log = data_dir.parent / f"serve-{port}.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "service.cli", "serve", "--no-worker", "--port", str(port)]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [*command, "--workers", str(workers)],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running = Serve(process, log, f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 240
        while sum(STARTED in str(m.get("msg", "")) for m in running.messages()) < workers:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"serve --workers {workers} did not start: {log}")
            time.sleep(0.3)
        yield running
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def redis_counters(client: redis.Redis) -> dict[str, float]:
    stats: dict[str, Any] = client.info("commandstats")
    cpu: dict[str, Any] = client.info("cpu")
    memory: dict[str, Any] = client.info("memory")
    # INFO itself is this benchmark's own reading, not the service's.
    counters = {
        f"cmd:{name[8:]}": float(v["calls"]) for name, v in stats.items() if name != "cmdstat_info"
    }
    counters["commands"] = sum(v for k, v in counters.items() if k.startswith("cmd:"))
    counters["cpu"] = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    counters["memory"] = float(memory["used_memory"])
    return counters


def database_bytes(database_url: str) -> float:
    if database_url.startswith("sqlite"):
        path = Path(database_url.removeprefix("sqlite:///"))
        return float(sum(p.stat().st_size for p in path.parent.glob(path.name + "*")))
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return float(
                conn.execute(
                    text(
                        "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = 'public' AND c.relkind = 'r'"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


@dataclass
class Costs:
    """Per-stored-event costs of one configuration, over its runs."""

    rates: list[float] = field(default_factory=list)
    api_cpu_ms: list[float] = field(default_factory=list)
    redis_commands: list[float] = field(default_factory=list)
    redis_cpu_us: list[float] = field(default_factory=list)
    redis_bytes: list[float] = field(default_factory=list)
    database_bytes: list[float] = field(default_factory=list)
    top_commands: dict[str, float] = field(default_factory=dict)


def measure_one(
    database_url: str,
    workers: int,
    data_dir: Path,
    bodies: Callable[[str], list[bytes]],
    post: Callable[[str, list[bytes], int], float],
    repeat: int,
    clients: int,
    count: Callable[[str], int],
) -> Costs:
    costs = Costs()
    with serve(database_url, workers, data_dir) as running:
        client = running.redis()
        post(running.url, bodies(f"w{workers}-warm")[:4], clients)
        for r in range(repeat):
            tagged = bodies(f"w{workers}-{uuid.uuid4().hex[:6]}-{r}")
            events_before = count(database_url)
            bytes_before = database_bytes(database_url)
            redis_before = redis_counters(client)
            cpu_before = running.cpu_seconds()
            seconds = post(running.url, tagged, clients)
            cpu_after = running.cpu_seconds()
            redis_after = redis_counters(client)
            stored = count(database_url) - events_before
            if stored <= 0:
                continue
            costs.rates.append(stored / seconds)
            costs.api_cpu_ms.append(1000 * (cpu_after - cpu_before) / stored)
            costs.redis_commands.append(
                (redis_after["commands"] - redis_before["commands"]) / stored
            )
            costs.redis_cpu_us.append(1e6 * (redis_after["cpu"] - redis_before["cpu"]) / stored)
            costs.redis_bytes.append((redis_after["memory"] - redis_before["memory"]) / stored)
            costs.database_bytes.append((database_bytes(database_url) - bytes_before) / stored)
            for name, value in redis_after.items():
                if name.startswith("cmd:"):
                    spent = (value - redis_before.get(name, 0.0)) / stored
                    if spent > 0:
                        costs.top_commands[name[4:]] = spent
    return costs


def figures_for(kind: str, workers: int, single: Costs, several: Costs) -> list[Figure]:
    def median(values: list[float]) -> float:
        return statistics.median(values) if values else float("nan")

    figures = [
        median_figure(
            2,
            f"POST /v1/events/batch x100 ({kind}), serve --workers {workers}, events stored/s",
            several.rates,
            "ev/s",
            "serve --workers 1, same run",
            single.rates,
            ">= 10,000 ev/s",
        ),
    ]
    for name, costs in ((f"--workers {workers}", several), ("--workers 1", single)):
        commands = sorted(costs.top_commands.items(), key=lambda item: -item[1])[:6]
        figures.append(
            median_figure(
                2,
                f"batch x100 ({kind}), {name}: API CPU per stored event",
                costs.api_cpu_ms,
                "ms",
                target="reported",
                note=(
                    f"Redis {median(costs.redis_commands):.2f} commands, "
                    f"{median(costs.redis_cpu_us):.1f} us CPU, "
                    f"{median(costs.redis_bytes):.0f} B memory; database "
                    f"{median(costs.database_bytes):.0f} B per event; commands: "
                    + ", ".join(f"{c} {v:.3f}" for c, v in commands)
                ),
            )
        )
    return figures
