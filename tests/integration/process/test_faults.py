"""Faults injected for real: a SIGKILLed API, a SIGKILLed worker mid-judgment (on either broker),
a Redis restarted and flushed with events in its queue, a Redis or a RabbitMQ node killed and
started again under traffic. Every accepted event ends judged exactly once.

Tests ``service.telemetry.rebuild``.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
from sqlalchemy import create_engine, text

from service.config.settings import Settings
from service.process.embedded import free_port
from service.store.migrate import upgrade
from tests.support.brokers import RabbitMQNode
from tests.support.database import db_scalar
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.fake_llm.server import read_call
from tests.support.helpers import make_event
from tests.support.live import (
    ApiProcess,
    FakeJudged,
    LiveServer,
    WorkerFactory,
    private_redis,
    wait_for,
    wait_while_progressing,
)
from tests.support.metrics_reading import metric_total

pytestmark = pytest.mark.slow

SATURATION_BATCHES = 300


def judge_calls_per_query(fake_llm: FakeLLM) -> Counter[str | None]:
    """How many requests the judge received for each query, read from the requests it kept."""
    requests = fake_llm.stats()["requests"]
    return Counter(read_call(request["messages"]).query for request in requests)


def test_every_acknowledged_event_survives_a_killed_api(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    """The API's commit is held (a second connection keeps SQLite's write lock) while clients
    post: no event sent meanwhile is acknowledged, since none can be committed. The API is
    SIGKILLed with its commit still held, and every event acknowledged before is stored."""
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    api = ApiProcess(settings, free_port(), tmp_path / "api.log").start()
    acknowledged: list[str] = []
    acknowledged_while_held: list[str] = []
    holding = threading.Event()
    stop = threading.Event()

    def client(worker: int) -> None:
        with httpx.Client(base_url=api.url, timeout=150) as http:
            i = 0
            while not stop.is_set():
                event_id = f"k{worker}-{i}"
                i += 1
                sent_while_held = holding.is_set()
                try:
                    response = http.post("/v1/events", json=make_event(event_id))
                except httpx.TransportError:
                    continue  # the server died under this request: not acknowledged
                if response.status_code in (200, 202):
                    acknowledged.append(event_id)
                    if sent_while_held:
                        acknowledged_while_held.append(event_id)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    lock = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=60)
    lock.isolation_level = None  # transactions as written below
    try:
        wait_for(lambda: len(acknowledged) >= 50, timeout=120, interval=0.05)
        lock.execute("BEGIN IMMEDIATE")  # the API's commits wait on this from now on
        holding.set()
        # An event sent now cannot be committed while the lock is held: its answer is an
        # acknowledgement only if the API answers before the commit. Otherwise it comes once the
        # API's writer gives up waiting for the database (its busy timeout, 30 s): a 503.
        with httpx.Client(base_url=api.url, timeout=150) as http:
            probe = http.post("/v1/events", json=make_event("probe"))
        if probe.status_code in (200, 202):
            acknowledged.append("probe")
        assert probe.status_code == 503, (probe.status_code, probe.text)
        assert not acknowledged_while_held, (
            f"{len(acknowledged_while_held)} events acknowledged while no commit could happen"
        )
        api.kill()  # the clients' requests sent since wait on the lock: killed uncommitted
        stop.set()
        for thread in threads:
            thread.join()
        lock.execute("ROLLBACK")
    finally:
        stop.set()
        lock.close()
        api.stop()
    api = ApiProcess(settings, api.port, tmp_path / "api.log").start()
    try:
        stored = {
            row[0]
            for row in create_engine(settings.database_url)
            .connect()
            .execute(text("SELECT event_id FROM events"))
        }
        assert len(acknowledged) >= 50
        missing = set(acknowledged) - stored
        assert not missing, f"{len(missing)} acknowledged events lost"
    finally:
        api.stop()


def test_a_worker_killed_mid_judgment_loses_nothing(
    redis_url: str,
    broker_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    settings = fake_judged(
        pending_requeue_seconds=3, sweep_interval_seconds=1, broker_url=broker_url
    )
    fake_llm.set_labels({(None, "passage number 1 about topic 1"): 3})
    fake_llm.set_fault("slow", count=2, delay=30)  # the first calls hang: kill during them
    first = worker_factory(settings, concurrency=2)
    first.start()
    with LiveServer(settings) as server:
        events = [make_event(f"w{i}", n=2, query=f"question {i}") for i in range(10)]
        assert (
            httpx.post(f"{server.url}/v1/events/batch", json={"events": events}).json()["accepted"]
            == 10
        )
        wait_for(lambda: fake_llm.stats()["calls"] >= 2, timeout=30)
        first.kill()
        killed_at = time.monotonic()
        worker_factory(settings, concurrency=2, with_scheduler=True).start()
        wait_for(
            lambda: db_scalar(settings, "SELECT count(*) FROM events WHERE status='judged'") == 10,
            timeout=120,
        )
        recovered = time.monotonic() - killed_at
        assert db_scalar(settings, "SELECT count(*) FROM scores") == 10
        wait_for(
            lambda: metric_total(server.url, "retrieval_monitor_events_judged_total") == 10, 30
        )
        assert metric_total(server.url, "retrieval_monitor_measure_precision_count") == 10
    # Each worker asks the judge at most once per event (its claim), so an event is asked once,
    # or twice when the killed worker had asked already: never more, and none is left unasked.
    calls = judge_calls_per_query(fake_llm)
    assert set(calls) == {f"question {i}" for i in range(10)}
    assert set(calls.values()) <= {1, 2}, calls
    print(
        f"recovered {recovered:.1f}s after the kill; judge calls per event {sorted(calls.values())}"
    )


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A Redis server of this test's own, so it can be flushed."""
    with private_redis(tmp_path, "--appendonly", "no") as url:
        yield url, url.rsplit(":", 1)[1].split("/")[0]


def test_redis_restarted_and_flushed_with_events_queued(
    own_redis: tuple[str, str],
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    url, _port = own_redis
    settings = fake_judged(redis=url, pending_requeue_seconds=1, sweep_interval_seconds=1)
    fake_llm.set_labels({(None, "passage number 1 about topic 1"): 3})
    with LiveServer(settings) as server:
        # Some events judged, then more queued while no worker runs.
        worker = worker_factory(settings)
        worker.start()
        batch = [make_event(f"a{i}", n=2, query=f"first {i}") for i in range(5)]
        httpx.post(f"{server.url}/v1/events/batch", json={"events": batch})
        wait_for(lambda: metric_total(server.url, "retrieval_monitor_events_judged_total") == 5)
        worker.stop()
        batch = [make_event(f"b{i}", n=2, query=f"second {i}") for i in range(7)]
        httpx.post(f"{server.url}/v1/events/batch", json={"events": batch})
        client = redis.Redis.from_url(url)
        wait_for(lambda: client.llen(settings.queue_name) > 0, timeout=10)
        # Redis loses everything: the queue, the aggregates, the once-only markers.
        client.flushall()
        flushed_at = time.monotonic()
        # Calls stay shorter than the requeue time: a claim lives that long, so a call outlasting
        # it could be asked again by a second delivery (docs/reliability.md says so).
        worker_factory(settings, with_scheduler=True).start()
        wait_for(
            lambda: db_scalar(settings, "SELECT count(*) FROM events WHERE status='judged'") == 12,
            timeout=120,
        )
        recovered = time.monotonic() - flushed_at
        wait_for(lambda: metric_total(server.url, "retrieval_monitor_events_judged_total") == 12)
        assert db_scalar(settings, "SELECT count(*) FROM scores") == 12
        assert metric_total(server.url, "retrieval_monitor_events_accepted_total") == 12
        assert metric_total(server.url, "retrieval_monitor_measure_precision_count") == 12
    # No call was in flight when Redis lost the queue: the re-sent events are asked once each,
    # and those judged before the flush are not asked again.
    expected = {f"first {i}" for i in range(5)} | {f"second {i}" for i in range(7)}
    assert judge_calls_per_query(fake_llm) == dict.fromkeys(expected, 1)
    print(f"recovered {recovered:.1f}s after the flush")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_saturation_answers_503_keeps_memory_bounded_and_loses_nothing(
    tmp_path: Path,
    redis_url: str,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    # The backlog is counted at every batch: with a count kept for a while, how many batches get
    # in before the first refusal depends on how fast this machine posts them.
    settings = fake_judged(max_pending_events=300, backpressure_refresh_seconds=0.001)
    api = ApiProcess(settings, free_port(), tmp_path / "api.log").start()
    assert api.process is not None
    accepted: set[str] = set()
    refused: list[tuple[int, str | None]] = []
    rss: list[float] = [rss_mib(api.process.pid)]
    try:
        # No worker yet: the backlog fills until ingest refuses, and keeps refusing.
        with httpx.Client(base_url=api.url, timeout=30) as http:
            for batch in range(SATURATION_BATCHES):
                events = [
                    make_event(f"s{batch}-{i}", n=5, query=f"q {batch} {i}") for i in range(50)
                ]
                response = http.post("/v1/events/batch", json={"events": events})
                if response.status_code == 200:
                    body = response.json()
                    accepted.update(
                        r["event_id"] for r in body["results"] if r["status"] == "accepted"
                    )
                else:
                    refused.append((response.status_code, response.headers.get("Retry-After")))
                rss.append(rss_mib(api.process.pid))
        assert refused, "the backlog bound never refused anything"
        assert {status for status, _ in refused} == {503}
        assert all(retry_after is not None and int(retry_after) >= 1 for _, retry_after in refused)
        # Refused work is not held in memory. Once refusals start, hundreds of refused batches
        # (each about 60 KB of JSON) add almost nothing: a leak of even a tenth of each body
        # would show as a slope of 0.006 MiB per batch over the second half.
        assert len(refused) >= SATURATION_BATCHES - 20
        refusing = rss[-len(refused) :]
        growth = max(refusing) - refusing[0]
        assert growth < 10, f"API RSS grew by {growth:.1f} MiB over {len(refused)} refusals"
        later = refusing[len(refusing) // 2 :]
        slope = float(np.polyfit(np.arange(len(later)), np.array(later), 1)[0])
        assert slope < 0.005, f"API RSS rises {slope:.4f} MiB per refused batch"
        # Once the load stops, everything accepted is judged.
        worker_factory(settings, concurrency=2).start()
        wait_for(
            lambda: (
                db_scalar(settings, "SELECT count(*) FROM events WHERE status='judged'")
                == len(accepted)
            ),
            timeout=300,
            interval=1.0,
        )
        assert db_scalar(settings, "SELECT count(*) FROM events") == len(accepted)
    finally:
        api.stop()
    print(
        f"accepted {len(accepted)}, refused {len(refused)} batches with 503, "
        f"API RSS {rss[0]:.0f} -> {max(rss):.0f} MiB, {slope:.4f} MiB per refused batch late on"
    )


class RedisServer:
    """A redis-server of the test's own on a fixed port, to be SIGKILLed and started again there
    (without persistence: it comes back empty, as a restarted cache node does)."""

    def __init__(self, tmp_path: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.command = [binary, "--port", str(free_port()), "--bind", "127.0.0.1"]
        self.command += ["--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
        self.url = f"redis://127.0.0.1:{self.command[2]}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(self.command, stdout=subprocess.DEVNULL)
        wait_for(self.answers, timeout=10)
        return self

    def answers(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url).ping())
        except redis.ConnectionError:
            return False

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


class Traffic:
    """Clients posting batches of five events to the API until stopped, each batch with events
    of its own; what was acknowledged and every status answered."""

    def __init__(self, url: str, prefix: str, clients: int = 2) -> None:
        self.url = url
        self.prefix = prefix
        self.acknowledged: list[str] = []
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._post, args=(n,)) for n in range(clients)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join()

    def _post(self, number: int) -> None:
        with httpx.Client(base_url=self.url, timeout=30) as http:
            batch = 0
            while not self._stop.is_set():
                events = [
                    make_event(
                        f"{self.prefix}{number}-{batch}-{i}", n=2, query=f"q {number} {batch}"
                    )
                    for i in range(5)
                ]
                batch += 1
                try:
                    response = http.post("/v1/events/batch", json={"events": events})
                except httpx.TransportError:
                    continue
                self.statuses.append(response.status_code)
                if response.status_code == 200:
                    self.acknowledged.extend(
                        r["event_id"]
                        for r in response.json()["results"]
                        if r["status"] == "accepted"
                    )


def outage_under_traffic(
    settings: Settings, kill: Callable[[], object], start: Callable[[], object], prefix: str
) -> None:
    """Posts go on while a worker judges; ``kill`` a part once 20 events are judged, let posts
    meet the outage, ``start`` it again and post 20 more events. Then every acknowledged event
    is stored and judged once, no answer was a 500, and the counters equal the database."""
    judged = "SELECT count(*) FROM events WHERE status='judged'"
    with LiveServer(settings) as api:
        with Traffic(api.url, prefix) as traffic:
            wait_for(lambda: db_scalar(settings, judged) >= 20, timeout=120)
            kill()
            posted_while_down = len(traffic.statuses)
            wait_for(lambda: len(traffic.statuses) > posted_while_down + 2, timeout=60)
            start()
            # Posts go on while the sweeper rebuilds what was lost and re-sends the events.
            resumed = len(traffic.acknowledged)
            wait_for(lambda: len(traffic.acknowledged) > resumed + 20, timeout=120)
        stored = db_scalar(settings, "SELECT count(*) FROM events")
        # Judging the backlog the outage left takes as long as the machine needs: the wait lasts
        # while the count of judged events still moves, and fails once it stalls.
        wait_while_progressing(
            lambda: db_scalar(settings, judged), stored, stall_seconds=120, interval=1
        )
        acknowledged = traffic.acknowledged
        assert len(set(acknowledged)) == len(acknowledged)
        assert stored == len(acknowledged)  # accepted = stored
        assert db_scalar(settings, "SELECT count(*) FROM scores") == stored  # judged once
        wait_for(
            lambda: metric_total(api.url, "retrieval_monitor_events_judged_total") == stored,
            timeout=60,
        )
        assert metric_total(api.url, "retrieval_monitor_events_accepted_total") == stored
        assert metric_total(api.url, "retrieval_monitor_measure_precision_count") == stored
    assert 500 not in traffic.statuses, sorted(set(traffic.statuses))


def test_redis_killed_and_restarted_under_traffic_loses_nothing(
    tmp_path: Path,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    """Clients post and a worker judges while redis-server is SIGKILLed and started again, empty,
    on the same port. Every acknowledged event is stored and judged once, and the counters the
    sweeper rebuilds from the database (while posts still commit) equal the database."""
    server = RedisServer(tmp_path).start()
    settings = fake_judged(redis=server.url, pending_requeue_seconds=1, sweep_interval_seconds=0.5)
    try:
        worker_factory(settings, concurrency=2, with_scheduler=True).start()
        # The queue, the counters and the once-only markers go with the kill.
        outage_under_traffic(settings, server.kill, server.start, "c")
    finally:
        server.stop()


def test_rabbitmq_killed_and_restarted_under_traffic_loses_nothing(
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    """The judge queue on a RabbitMQ node of the test's own (RM_BROKER_URL), the aggregates on
    Redis. Clients post and a worker judges while the node is SIGKILLed and started again on the
    same port and data: every acknowledged event is stored and judged once, and the counters,
    which the broker never held, equal the database."""
    node = RabbitMQNode().start()
    settings = fake_judged(
        broker_url=node.url, pending_requeue_seconds=1, sweep_interval_seconds=0.5
    )
    try:
        worker_factory(settings, concurrency=2, with_scheduler=True).start()
        # The worker's and the API's connections break mid-stream.
        outage_under_traffic(settings, node.kill, node.start, "r")
    finally:
        node.stop()
