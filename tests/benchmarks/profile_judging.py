"""The worker's cost per slice, in one process: SQL statements sent and CPU per judged event.

Events (k=10, passages from the ingest benchmark's pool of 200 texts, queries new to the label
cache) are stored through the real ingest path, then judged slice by slice with the worker's own
``judge_events`` against the test's OpenAI-compatible server, which answers at once. A listener
on the engine counts every statement the server executes: an executemany of N rows counts N (the
driver sends one statement per row, pipelined), an INSERT of unnested arrays counts one. CPU is
this process's (``time.process_time``, so the judge calls' threads count too) over the whole
slice, and the database server's backends' (from /proc); the judge server runs in a process of
its own and its time is not counted. With ``--earlier N`` the tables first hold N judged events
(``earlier_events``: statistics left as a bulk load leaves them), as the lag figure asks.

Run: ``python -m tests.benchmarks.profile_judging`` (``--events``, ``--slice``, ``--no-sqlite``,
``--no-postgres``, ``--earlier``).
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from fastapi.testclient import TestClient
from sqlalchemy import event as sa_event
from sqlalchemy import text

from service.api.app import create_app
from service.config.settings import Settings
from service.store.migrate import upgrade
from service.wiring.runtime import Runtime
from tests.benchmarks import earlier_events
from tests.benchmarks.bench_ingest import event, store
from tests.benchmarks.common import REDIS_URL, cpu_seconds, in_process_settings
from tests.support.fake_llm.fixture import running_fake_llm
from workers.judge import make_judge
from workers.judging import judge_events


class StatementCounter:
    """Statements the database executes, by their first words, while ``counting``."""

    def __init__(self) -> None:
        self.by_kind: Counter[str] = Counter()
        self.on = False

    def __call__(
        self,
        conn: Any,
        cursor: Any,
        statement: str,
        parameters: Any,
        context: Any,
        executemany: bool,
    ) -> None:
        if not self.on:
            return
        words = statement.split()
        kind = " ".join(words[:3]) if words[:1] == ["INSERT"] else " ".join(words[:1])
        if words[:1] == ["SELECT"]:
            tables = re.findall(r"\bFROM\s+([a-z_]+)", statement)
            kind = "SELECT FROM " + ", ".join(dict.fromkeys(tables))
        self.by_kind[kind] += len(parameters) if executemany else 1

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.on = True
        try:
            yield
        finally:
            self.on = False


def store_events(settings: Settings, run: str, count: int) -> None:
    with TestClient(create_app(settings)) as client:
        for first in range(0, count, 100):
            batch = [event(i, run) for i in range(first, min(first + 100, count))]
            answer = client.post("/v1/events/batch", json={"events": batch})
            assert answer.status_code == 200, answer.text


def pending_pks(runtime: Runtime, run: str) -> list[int]:
    with runtime.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT id FROM events WHERE event_id LIKE :run ORDER BY id"),
            {"run": f"{run}-%"},
        )
        return [int(row[0]) for row in rows]


def table_scans(runtime: Runtime) -> Counter[str]:
    """Sequential scans per table since the server started (PostgreSQL's statistics views)."""
    # A backend reports its counts at most once a second: wait for the last ones to land.
    time.sleep(1.5)
    with runtime.engine.connect() as conn:
        rows = conn.execute(text("SELECT relname, seq_scan FROM pg_stat_user_tables"))
        return Counter({str(name): int(scans) for name, scans in rows})


def server_cpu_seconds(runtime: Runtime) -> float:
    """CPU time of the PostgreSQL backends serving this database (the server is local)."""
    with runtime.engine.connect() as conn:
        pids = conn.execute(
            text("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        ).scalars()
        return sum(cpu_seconds(int(pid)) for pid in pids)


def profile(kind: str, events: int, slice_events: int, earlier: int, tmp: Path) -> dict[str, Any]:
    redis.Redis.from_url(REDIS_URL).flushdb()
    with running_fake_llm() as fake, store(kind, tmp) as database_url:
        upgrade(database_url)
        settings = in_process_settings(
            database_url,
            tmp,
            judge_base_url=fake.base_url,
            judge_model="fake-judge",
            log_json=False,
        )
        fake.set_labels(default_grade=2)
        runtime = Runtime(settings)
        judge = make_judge(settings, runtime.redis)
        counter = StatementCounter()
        sa_event.listen(runtime.engine, "before_cursor_execute", counter)
        if earlier:
            earlier_events.fill(database_url, earlier)
        run = uuid.uuid4().hex[:6]
        store_events(settings, run, events)
        pks = pending_pks(runtime, run)
        warm, measured = pks[: slice_events * 2], pks[slice_events * 2 :]
        for start in range(0, len(warm), slice_events):
            judge_events(runtime, judge, warm[start : start + slice_events])
        cpu: list[float] = []
        wall: list[float] = []
        statements: list[int] = []
        judged = 0
        total = Counter[str]()
        scans_before = table_scans(runtime) if kind == "postgres" else Counter[str]()
        server_before = server_cpu_seconds(runtime) if kind == "postgres" else 0.0
        for start in range(0, len(measured), slice_events):
            chunk = measured[start : start + slice_events]
            counter.by_kind.clear()
            began, began_wall = time.process_time(), time.perf_counter()
            with counter.counting():
                result = judge_events(runtime, judge, chunk)
            cpu.append(time.process_time() - began)
            wall.append(time.perf_counter() - began_wall)
            judged += sum(outcome == "judged" for outcome in result.outcomes.values())
            statements.append(sum(counter.by_kind.values()))
            total.update(counter.by_kind)
        server = server_cpu_seconds(runtime) - server_before if kind == "postgres" else 0.0
        scans = table_scans(runtime) - scans_before if kind == "postgres" else Counter[str]()
        runtime.engine.dispose()
    slices = len(statements)
    return {
        "store": kind,
        "slices": slices,
        "judged": judged,
        "statements_per_slice": statistics.median(statements),
        "by_kind": {name: count / slices for name, count in total.most_common()},
        "cpu_ms_per_event": 1000 * sum(cpu) / max(judged, 1),
        "wall_ms_per_slice": 1000 * statistics.median(wall),
        "wall_ms_slowest_slice": 1000 * max(wall),
        "seq_scans": dict(scans),
        "server_cpu_ms_per_event": 1000 * server / max(judged, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="SQL statements per judged slice and worker CPU per judged event, measured "
        "in one process against a real database, Redis and the test judge server."
    )
    parser.add_argument("--events", type=int, default=480, help="events judged and measured")
    parser.add_argument("--slice", type=int, default=16, help="events per slice")
    parser.add_argument(
        "--earlier", type=int, default=0, help="judged events already in the tables first"
    )
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args(argv)
    kinds = [
        k for k, off in (("sqlite", args.no_sqlite), ("postgres", args.no_postgres)) if not off
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for kind in kinds:
            figures = profile(kind, args.events, args.slice, args.earlier, Path(tmp))
            print(
                f"{kind}: {figures['judged']} events judged in {figures['slices']} slices of "
                f"{args.slice}; {figures['statements_per_slice']:.0f} statements per slice "
                f"(median), {figures['wall_ms_per_slice']:.1f} ms each (median, slowest "
                f"{figures['wall_ms_slowest_slice']:.0f}); worker CPU "
                f"{figures['cpu_ms_per_event']:.2f} ms per judged event"
                + (
                    f", database server CPU {figures['server_cpu_ms_per_event']:.2f} ms"
                    if kind == "postgres"
                    else ""
                )
            )
            for name, count in figures["by_kind"].items():
                print(f"  {count:8.1f}  {name}")
            if figures["seq_scans"]:
                print(f"  sequential scans while measured: {figures['seq_scans']}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
