"""`serve --workers 2`, the real command: two API processes on one port keep every count exact,
share one rate limit, and stop with serve.

Concurrent clients send single events and batches (fresh, re-sent, conflicting and invalid
events, and the same new event_id from several threads at once); the database, /metrics and the
clients' own tally must then agree exactly. On SQLite and on PostgreSQL, with the embedded Redis.

Tests ``service.process.server`` and ``service.store.engine`` (several processes writing one
SQLite file).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text

from service.auth.keys import key_hash, new_key
from service.process.embedded import free_port
from service.store.engine import session_scope
from service.store.keys import add_key
from service.store.migrate import upgrade
from tests.support.helpers import make_event
from tests.support.paths import REPO_ROOT
from tests.support.procfs import cmdline, descendants, holds_connection_on, running

API_PROCESSES = 2
STARTED = "Application startup complete."
TENANTS = ("acme", "globex")
THREADS_PER_TENANT = 3
ROUNDS = 12
BATCH_FRESH = 12


@dataclass
class Serve:
    """One `retrieval-monitor serve --workers 2` process and what it started."""

    process: subprocess.Popen[bytes]
    log: Path
    url: str
    port: int

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                try:
                    lines.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return lines

    def ready(self) -> bool:
        started = sum(STARTED in str(line.get("msg", "")) for line in self.log_lines())
        if started < API_PROCESSES:
            return False
        try:
            return httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def embedded_redis_pid(self) -> int:
        for line in self.log_lines():
            if line.get("msg") == "embedded Redis started":
                return int(line["pid"])
        raise AssertionError("serve did not log the embedded Redis")

    def api_pids(self) -> set[int]:
        """The API processes: the children uvicorn's supervisor spawned."""
        return {
            pid
            for pid in descendants(self.process.pid)
            if "spawn_main" in cmdline(pid) and "resource_tracker" not in cmdline(pid)
        }

    def api_pids_with_clients(self) -> set[int]:
        """API processes holding an established connection on the port."""
        return {pid for pid in self.api_pids() if holds_connection_on(pid, self.port)}

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


@pytest.fixture
def start_serve(tmp_path: Path) -> Iterator[Any]:
    started: list[Serve] = []

    def start(database_url: str, *flags: str, **settings: str) -> Serve:
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
        env.update(
            {
                "RM_DATA_DIR": str(tmp_path / "var"),
                "RM_DATABASE_URL": database_url,
                "RM_LOG_JSON": "true",
                # No judging: what is measured here is ingest, and the judge would only load
                # the shared machine.
                "RM_SAMPLE_RATE": "0",
                "PYTHONPATH": str(REPO_ROOT),
            }
        )
        env.update(settings)
        log = tmp_path / f"serve-{port}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "service.cli",
                    "serve",
                    "--workers",
                    str(API_PROCESSES),
                    "--port",
                    str(port),
                    *flags,
                ],
                env=env,
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        serve = Serve(process, log, f"http://127.0.0.1:{port}", port)
        started.append(serve)
        deadline = time.monotonic() + 180
        while not serve.ready():
            assert process.poll() is None, serve.tail()
            assert time.monotonic() < deadline, serve.tail()
            time.sleep(0.3)
        return serve

    yield start
    for serve in started:
        if serve.process.poll() is None:
            serve.process.send_signal(signal.SIGTERM)
            try:
                serve.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                serve.process.kill()


def create_key(database_url: str, tenant: str, admin: bool = False) -> str:
    upgrade(database_url)
    key = new_key()
    engine = create_engine(database_url)
    with session_scope(engine) as session:
        add_key(session, tenant, key_hash(key), "workers test", admin, datetime.now(UTC))
        session.commit()
    engine.dispose()
    return key


def metric_by_tenant(url: str, admin_key: str | None, family: str) -> Counter[tuple[str, str]]:
    """A counter's values summed by (tenant, reason or "")."""
    headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
    page = httpx.get(f"{url}/metrics", headers=headers, timeout=30)
    page.raise_for_status()
    totals: Counter[tuple[str, str]] = Counter()
    for fam in text_string_to_metric_families(page.text):
        for sample in fam.samples:
            if sample.name == family:
                key = (sample.labels["tenant"], sample.labels.get("reason", ""))
                totals[key] += int(sample.value)
    return totals


def http_responses(
    url: str, admin_key: str, wanted: set[tuple[str, str]]
) -> dict[tuple[str, str], int]:
    """``http_responses_total`` by (route, status class), for the pairs in ``wanted``."""
    page = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {admin_key}"}, timeout=30)
    page.raise_for_status()
    found: dict[tuple[str, str], int] = {}
    for fam in text_string_to_metric_families(page.text):
        for sample in fam.samples:
            if sample.name == "retrieval_monitor_http_responses_total":
                key = (sample.labels["route"], sample.labels["status_class"])
                if key in wanted:
                    found[key] = int(sample.value)
    return found


def stored_ids(database_url: str, tenant: str) -> Counter[str]:
    engine = create_engine(database_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT event_id, COUNT(*) FROM events WHERE tenant = :t GROUP BY event_id"),
            {"t": tenant},
        ).all()
    engine.dispose()
    return Counter({row[0]: int(row[1]) for row in rows})


@dataclass
class Tally:
    """What the clients of one tenant were told."""

    accepted: list[str] = field(default_factory=list)
    duplicate: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    unexpected: list[str] = field(default_factory=list)
    answers: Counter[tuple[str, str]] = field(default_factory=Counter)  # (route, status class)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def single(self, event_id: str, answer: httpx.Response) -> None:
        with self.lock:
            self.answers[("/v1/events", f"{answer.status_code // 100}xx")] += 1
            if answer.status_code == 202:
                self.accepted.append(event_id)
            elif answer.status_code == 200:
                self.duplicate += 1
            elif answer.status_code == 409:
                self.rejected["conflict"] += 1
            elif answer.status_code == 422:
                self.rejected["invalid"] += 1
            else:
                self.unexpected.append(f"{answer.status_code} {answer.text[:200]}")

    def batch(self, answer: httpx.Response) -> None:
        with self.lock:
            self.answers[("/v1/events/batch", f"{answer.status_code // 100}xx")] += 1
            if answer.status_code != 200:
                self.unexpected.append(f"batch {answer.status_code} {answer.text[:200]}")
                return
            for result in answer.json()["results"]:
                if result["status"] == "accepted":
                    self.accepted.append(result["event_id"])
                elif result["status"] == "duplicate":
                    self.duplicate += 1
                else:
                    self.rejected[
                        "conflict" if "already used" in result["error"] else "invalid"
                    ] += 1


class Connections:
    """Requests of one client thread, spread over two keep-alive connections: more connections
    make it all but certain that both API processes hold some."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self._clients = [
            httpx.Client(base_url=url, headers=headers or {}, timeout=120) for _ in range(2)
        ]
        self._sent = 0

    def post(self, path: str, json: Any) -> httpx.Response:
        self._sent += 1
        return self._clients[self._sent % 2].post(path, json=json)

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *_exc: object) -> None:
        for client in self._clients:
            client.close()


def send_traffic(
    client: Connections, tenant: str, thread: int, tally: Tally, race: threading.Barrier
) -> None:
    mine: list[dict[str, Any]] = []
    for round_ in range(ROUNDS):
        # The same new id from every thread of the tenant at once: one is stored, the others
        # are told it is a duplicate, whichever process each request reaches.
        raced = make_event(f"race-{tenant}-{round_}", query="the raced event")
        race.wait(timeout=120)
        tally.single(raced["event_id"], client.post("/v1/events", json=raced))

        fresh = make_event(f"{tenant}-{thread}-{round_}-single-{uuid.uuid4().hex[:6]}")
        tally.single(fresh["event_id"], client.post("/v1/events", json=fresh))
        mine.append(fresh)

        batch = [
            make_event(f"{tenant}-{thread}-{round_}-b{i}-{uuid.uuid4().hex[:6]}")
            for i in range(BATCH_FRESH)
        ]
        resent = mine[-2:]  # already stored: duplicates
        invalid = [{**make_event(f"{tenant}-{thread}-{round_}-bad"), "passages": "none"}]
        tally.batch(client.post("/v1/events/batch", json={"events": batch + resent + invalid}))
        mine.extend(batch)

        again = mine[len(mine) // 2]
        tally.single(again["event_id"], client.post("/v1/events", json=again))
        if round_ % 3 == 0:
            conflicting = {**again, "query": "another query under a used id"}
            tally.single(again["event_id"], client.post("/v1/events", json=conflicting))
        broken = {**make_event(f"{tenant}-{thread}-{round_}-broken"), "passages": [{"id": "x"}]}
        tally.single(broken["event_id"], client.post("/v1/events", json=broken))


def run_clients(serve: Serve, keys: dict[str, str]) -> tuple[dict[str, Tally], set[int]]:
    """Send the traffic from every thread; also which API processes held the clients."""
    tallies = {tenant: Tally() for tenant in keys}
    barriers = {tenant: threading.Barrier(THREADS_PER_TENANT) for tenant in keys}
    sent = threading.Barrier(len(keys) * THREADS_PER_TENANT + 1)
    looked = threading.Event()
    failures: list[BaseException] = []

    def client_thread(tenant: str, thread: int) -> None:
        headers = {"Authorization": f"Bearer {keys[tenant]}"}
        with Connections(serve.url, headers) as client:
            try:
                send_traffic(client, tenant, thread, tallies[tenant], barriers[tenant])
            except BaseException as exc:
                failures.append(exc)
                barriers[tenant].abort()
            finally:
                sent.wait(timeout=600)
                looked.wait(timeout=60)  # connections stay open until they were looked at

    threads = [
        threading.Thread(target=client_thread, args=(tenant, i))
        for tenant in keys
        for i in range(THREADS_PER_TENANT)
    ]
    for thread in threads:
        thread.start()
    sent.wait(timeout=600)
    try:
        serving = serve.api_pids_with_clients()
    finally:
        looked.set()
        for thread in threads:
            thread.join(timeout=60)
    assert not failures, failures
    return tallies, serving


def test_two_api_processes_count_every_event_once(
    start_serve: Any, store_url: str, tmp_path: Path
) -> None:
    keys = {tenant: create_key(store_url, tenant) for tenant in TENANTS}
    admin = create_key(store_url, "ops", admin=True)
    serve = start_serve(store_url, RM_AUTH_REQUIRED="true", RM_MAX_COMMIT_SECONDS="60")
    assert len(serve.api_pids()) == API_PROCESSES

    tallies, serving = run_clients(serve, keys)

    # The clients' connections were spread over both processes: the counts below crossed them.
    assert serving == serve.api_pids()
    accepted = metric_by_tenant(serve.url, admin, "retrieval_monitor_events_accepted_total")
    duplicate = metric_by_tenant(serve.url, admin, "retrieval_monitor_events_duplicate_total")
    rejected = metric_by_tenant(serve.url, admin, "retrieval_monitor_events_rejected_total")
    for tenant, tally in tallies.items():
        assert tally.unexpected == []
        stored = stored_ids(store_url, tenant)
        # Every accepted event is stored exactly once, and nothing else is.
        assert set(stored.values()) == {1}
        assert Counter(tally.accepted) == stored
        for round_ in range(ROUNDS):
            assert tally.accepted.count(f"race-{tenant}-{round_}") == 1
        # /metrics says exactly what the clients were told.
        assert accepted[(tenant, "")] == len(tally.accepted)
        assert duplicate[(tenant, "")] == tally.duplicate
        assert {
            reason: count for (who, reason), count in rejected.items() if who == tenant
        } == dict(tally.rejected)
        assert tally.duplicate >= ROUNDS * (THREADS_PER_TENANT - 1)
        assert tally.rejected["conflict"] > 0

    # HTTP answers are counted in each process and added to Redis once a second: once the last
    # flush is in, they too equal the clients' count.
    answered = sum((tally.answers for tally in tallies.values()), Counter[tuple[str, str]]())
    http_answers: dict[tuple[str, str], int] = {}

    def http_answers_flushed() -> bool:
        http_answers.clear()
        http_answers.update(http_responses(serve.url, admin, set(answered)))
        return http_answers == dict(answered)

    deadline = time.monotonic() + 30
    while not http_answers_flushed() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert http_answers == dict(answered)

    # SIGKILL: serve cannot stop anything itself; nothing it started may keep running.
    started = set(descendants(serve.process.pid))
    started.add(serve.embedded_redis_pid())
    assert serve.api_pids() <= started
    assert len(started) >= API_PROCESSES + 3
    serve.process.send_signal(signal.SIGKILL)
    serve.process.wait(timeout=10)
    deadline = time.monotonic() + 90
    while left := {pid for pid in started if running(pid)}:
        assert time.monotonic() < deadline, f"still running after serve was killed: {left}"
        time.sleep(0.2)


def test_a_tenant_rate_is_one_limit_across_the_processes(start_serve: Any, sqlite_url: str) -> None:
    rate, burst, threads = 10.0, 10.0, 8
    serve = start_serve(
        sqlite_url,
        "--no-worker",
        RM_TENANT_EVENTS_PER_SECOND=str(rate),
        RM_TENANT_BURST_EVENTS=str(burst),
    )
    tally = Tally()
    stop = threading.Event()
    sending = threading.Barrier(threads + 1)
    looked = threading.Event()

    def client_thread(thread: int) -> None:
        with Connections(serve.url) as client:
            n = 0
            while not stop.is_set():
                event = make_event(f"rate-{thread}-{n}")
                answer = client.post("/v1/events", json=event)
                n += 1
                if answer.status_code == 429:
                    tally.rejected["rate_limited"] += 1
                else:
                    tally.single(event["event_id"], answer)
            sending.wait(timeout=120)
            looked.wait(timeout=60)

    workers = [threading.Thread(target=client_thread, args=(i,)) for i in range(threads)]
    began = time.monotonic()
    for worker in workers:
        worker.start()
    time.sleep(4.0)
    stop.set()
    sending.wait(timeout=120)
    elapsed = time.monotonic() - began
    try:
        serving = serve.api_pids_with_clients()
    finally:
        looked.set()
        for worker in workers:
            worker.join(timeout=60)

    assert serving == serve.api_pids()
    assert tally.unexpected == []
    # Every request was admitted between `began` and now: one bucket for both processes can
    # have handed out at most its burst plus its rate over that time; a bucket per process
    # would have handed out about twice that under this load.
    assert burst <= len(tally.accepted) <= burst + rate * elapsed + 1
    assert tally.rejected["rate_limited"] > len(tally.accepted)
    assert Counter(tally.accepted) == stored_ids(sqlite_url, "default")
    accepted = metric_by_tenant(serve.url, None, "retrieval_monitor_events_accepted_total")
    rejected = metric_by_tenant(serve.url, None, "retrieval_monitor_events_rejected_total")
    assert accepted[("default", "")] == len(tally.accepted)
    assert rejected[("default", "rate_limited")] == tally.rejected["rate_limited"]
