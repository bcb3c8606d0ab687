"""Group commit of single-event requests: each request of a shared transaction gets its own
outcome, a database failure answers every request of the group, shutdown drains the queue, and
concurrent requests to a real server are all stored exactly once.

Tests ``service.ingest.ingestor``.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.api.app import create_app
from service.config.settings import Settings
from service.contract.schemas import EventIn, IngestResult
from service.http.state import AppState
from service.ingest.group_commit import GroupCommitter, NotStoredError, Store
from service.ingest.ingestor import Ingestor
from service.ingest.judge_queue import JudgeQueue
from service.process.embedded import free_port
from service.store.migrate import upgrade
from service.store.models import Event
from service.wiring.runtime import Runtime
from tests.support.database import count_rows
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.live import ApiProcess, LiveServer, wait_for
from tests.support.metrics_reading import metric_total, sample


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{request.param}_url")
    upgrade(url)
    return url


def committer_for(settings: Settings, max_group: int = 100) -> GroupCommitter:
    runtime = Runtime(settings)
    ingestor = Ingestor(runtime, JudgeQueue(settings.redis_url, settings.queue_name))
    return GroupCommitter(ingestor.ingest, max_group=max_group, capacity=max_group)


def event(event_id: str, **extra: Any) -> EventIn:
    return EventIn.model_validate(make_event(event_id, **extra))


def outcome(future: Future[IngestResult]) -> str:
    try:
        return future.result(timeout=60).status
    except NotStoredError as exc:
        return f"{exc.status_code} {exc.reason}"


def test_one_group_gives_each_request_its_own_outcome(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    settings = make_settings(tmp_path, database_url, redis_url)
    committer = committer_for(settings)
    # Queued before the writer starts, so all of them are one group.
    futures = [
        committer.submit("a", event("e1")),
        committer.submit("a", event("e1")),  # the same event again: a duplicate
        committer.submit("a", event("e1", query="another question")),  # the id reused: conflict
        committer.submit("b", event("e1")),  # another tenant's e1 is its own event
        committer.submit("a", event("e2")),
    ]
    committer.start()
    assert [outcome(f) for f in futures] == [
        "accepted",
        "duplicate",
        "rejected",
        "accepted",
        "accepted",
    ]
    assert "different event" in (futures[2].result().error or "")
    committer.close()
    assert count_rows(settings, Event) == 3


def test_a_group_larger_than_the_bound_is_split(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    committer = committer_for(settings, max_group=4)
    futures = [committer.submit("a", event(f"e{i}")) for i in range(4)]
    with pytest.raises(NotStoredError, match="already wait") as refused:
        committer.submit("a", event("e4"))  # the queue is bounded
    assert refused.value.reason == "queue_full"
    committer.start()
    assert [outcome(f) for f in futures] == ["accepted"] * 4
    more = [committer.submit("a", event(f"f{i}")) for i in range(3)]
    assert [outcome(f) for f in more] == ["accepted"] * 3
    committer.close()
    assert count_rows(settings, Event) == 7


def test_an_event_the_database_refuses_fails_only_its_own_request(
    tmp_path: Path, postgres_url: str, redis_url: str
) -> None:
    # Validation now refuses NaN; past it (model_copy does not validate), PostgreSQL's json type
    # refuses it too: a value the database alone rejects.
    settings = make_settings(tmp_path, postgres_url, redis_url)
    committer = committer_for(settings)
    refused = event("bad").model_copy(update={"metadata": {"x": float("nan")}})
    futures = [
        committer.submit("a", event("good-1")),
        committer.submit("a", refused),
        committer.submit("a", event("good-2")),
    ]
    committer.start()
    # The group's transaction fails; each event is then stored alone and only "bad" is refused
    # (the event API answers it with a 422).
    assert [outcome(f) for f in futures] == ["accepted", "rejected", "accepted"]
    error = futures[1].result().error or ""
    assert error.startswith("the database refused the event: invalid input syntax"), error
    committer.close()
    assert count_rows(settings, Event) == 2


def rename_events_table(database_url: str, old: str, new: str) -> None:
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text(f"ALTER TABLE {old} RENAME TO {new}"))
    engine.dispose()


def test_a_database_failure_answers_every_request_of_the_group(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    committer = committer_for(settings)
    rename_events_table(sqlite_url, "events", "events_away")
    futures = [committer.submit("a", event(f"e{i}")) for i in range(3)]
    committer.start()
    assert [outcome(f) for f in futures] == ["503 store_failed"] * 3
    with pytest.raises(NotStoredError, match="the database or the broker is unavailable"):
        futures[0].result()
    # The writer survives the failure: once the database is back, events are stored again.
    rename_events_table(sqlite_url, "events_away", "events")
    assert outcome(committer.submit("a", event("e0"))) == "accepted"
    committer.close()
    assert count_rows(settings, Event) == 1


def test_a_database_failure_is_a_503_with_retry_after_over_http(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    # No backlog bound: its pending count would meet the missing table before the insert does.
    settings = make_settings(tmp_path, sqlite_url, redis_url, max_pending_events=0)
    with TestClient(create_app(settings)) as client:
        rename_events_table(sqlite_url, "events", "events_away")
        response = client.post("/v1/events", json=make_event("e1"))
        assert response.status_code == 503
        assert response.headers["Retry-After"] == str(settings.backpressure_retry_after_seconds)
        assert "the event was not stored" in response.json()["detail"]
        rename_events_table(sqlite_url, "events_away", "events")
        assert client.post("/v1/events", json=make_event("e1")).status_code == 202
        assert sample(client, "retrieval_monitor_events_rejected_total", reason="store_failed") == 1


def test_closing_drains_the_queue_and_then_refuses(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    committer = committer_for(settings)
    futures = [committer.submit("a", event(f"e{i}")) for i in range(5)]
    committer.close()  # never started: the queue is still committed, not dropped
    assert [outcome(f) for f in futures] == ["accepted"] * 5
    assert count_rows(settings, Event) == 5
    with pytest.raises(NotStoredError, match="shutting down") as refused:
        committer.submit("a", event("late"))
    assert refused.value.reason == "stopping"


def post_concurrently(
    url: str, clients: int, per_client: int, shared: int
) -> tuple[Counter[int], Counter[str], int]:
    """Each client posts its own events plus ``shared`` ids every client sends (same content),
    then resends its first event; answers by status, accepted ids by count, and how many sends
    a transport error made the client repeat (as a client should: same event_id)."""
    statuses: Counter[int] = Counter()
    accepted: Counter[str] = Counter()
    resent = 0
    lock = threading.Lock()

    def client(number: int) -> None:
        nonlocal resent
        ids = [f"c{number}-{i}" for i in range(per_client)] + [f"s{i}" for i in range(shared)]
        ids.append(ids[0])
        with httpx.Client(base_url=url, timeout=60) as http:
            for event_id in ids:
                for _attempt in range(3):
                    try:
                        answer = http.post("/v1/events", json=make_event(event_id))
                        break
                    except httpx.TransportError:
                        with lock:
                            resent += 1
                else:
                    raise AssertionError(f"{event_id}: three transport errors in a row")
                with lock:
                    statuses[answer.status_code] += 1
                    if answer.status_code == 202:
                        accepted[answer.json()["event_id"]] += 1

    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return statuses, accepted, resent


def test_concurrent_requests_are_all_stored_exactly_once(
    tmp_path: Path, database_url: str, redis_url: str
) -> None:
    settings = make_settings(tmp_path, database_url, redis_url)
    clients, per_client, shared = 12, 15, 5
    with LiveServer(settings) as server:
        statuses, accepted, resent = post_concurrently(server.url, clients, per_client, shared)
        counted = metric_total(server.url, "retrieval_monitor_events_accepted_total")
    unique = clients * per_client + shared
    duplicates = clients * (shared + 1) - shared
    # Every request answered 2xx; each id accepted once, every other send of it a duplicate.
    # A send repeated after a transport error whose first attempt was stored reads as a
    # duplicate: only then may an id lack its 202.
    assert set(statuses) <= {200, 202}
    assert statuses.total() == unique + duplicates
    assert set(accepted.values()) == {1}
    assert unique - resent <= len(accepted) <= unique
    if resent == 0:
        assert statuses == {202: unique, 200: duplicates}
    assert count_rows(settings, Event) == unique
    assert counted == unique


@pytest.fixture
def api_process(tmp_path: Path, sqlite_url: str, redis_url: str) -> Iterator[ApiProcess]:
    upgrade(sqlite_url)
    api = ApiProcess(
        make_settings(tmp_path, sqlite_url, redis_url), free_port(), tmp_path / "api.log"
    )
    yield api.start()
    api.stop()


@pytest.mark.slow
def test_sigterm_under_load_answers_every_request_and_stores_every_acknowledged_event(
    api_process: ApiProcess,
) -> None:
    acknowledged: list[str] = []
    other: list[int] = []
    stop = threading.Event()

    def client(worker: int) -> None:
        with httpx.Client(base_url=api_process.url, timeout=30) as http:
            i = 0
            while not stop.is_set():
                event_id = f"t{worker}-{i}"
                i += 1
                try:
                    response = http.post("/v1/events", json=make_event(event_id))
                except httpx.TransportError:
                    return  # the server stopped listening: this request was never taken
                if response.status_code in (200, 202):
                    acknowledged.append(event_id)
                else:
                    other.append(response.status_code)

    threads = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: len(acknowledged) >= 100, timeout=60, interval=0.05)
        assert api_process.process is not None
        api_process.process.send_signal(signal.SIGTERM)
        assert api_process.process.wait(timeout=60) == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    # Nothing acknowledged is missing; anything refused was refused with a 503, never a 500.
    stored = {
        row[0]
        for row in create_engine(api_process.settings.database_url)
        .connect()
        .execute(text("SELECT event_id FROM events"))
    }
    assert not set(acknowledged) - stored
    assert set(other) <= {503}


class HeldCommitter(GroupCommitter):
    """The app's committer whose writer waits at a gate before storing, and which counts the
    events handed to it: a request is past admission and waiting for its commit once counted."""

    def __init__(self, store: Store, capacity: int) -> None:
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.submitted = 0
        self._count_lock = threading.Lock()
        super().__init__(self._held(store), max_group=capacity, capacity=capacity)

    def _held(self, store: Store) -> Store:
        def held(tenant: str, events: Sequence[EventIn]) -> list[IngestResult]:
            self.entered.set()
            if not self.gate.wait(60):
                raise RuntimeError("the gate was never opened")
            return store(tenant, events)

        return held

    def submit(self, tenant: str, event: EventIn) -> Future[IngestResult]:
        future = super().submit(tenant, event)
        with self._count_lock:
            self.submitted += 1
        return future


# More requests than the thread pool's 40 threads (anyio's default limiter): were each waiting
# request holding one, the rest and any sync route would wait behind them.
WAITING_REQUESTS = 48


def test_requests_waiting_for_their_commit_hold_no_thread_and_get_their_own_outcome(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    server = LiveServer(settings)
    app = server.server.config.app
    assert isinstance(app, FastAPI)
    state: AppState = app.state.rm
    # Replaced before the app starts: its lifespan starts and drains this one.
    held = HeldCommitter(state.ingestor.ingest, settings.max_batch_events)
    state.committer = held
    bodies = [make_event(f"e{i}") for i in range(WAITING_REQUESTS - 4)]
    bodies += [make_event("same"), make_event("same")]  # one accepted, one duplicate
    bodies += [make_event("reused"), make_event("reused", query="another question")]  # a 409
    with server, ThreadPoolExecutor(len(bodies)) as pool:

        def post(body: dict[str, Any]) -> httpx.Response:
            return httpx.post(f"{server.url}/v1/events", json=body, timeout=90)

        answers = [pool.submit(post, body) for body in bodies]
        try:
            wait_for(lambda: held.submitted == len(bodies), timeout=30, interval=0.02)
            assert held.entered.wait(30)
            # Every request waits for its commit, and the server still answers, a sync route too.
            assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
            assert not any(answer.done() for answer in answers)
            assert count_rows(settings, Event) == 0
        finally:
            held.gate.set()  # on a failure too, so the server can stop
        responses = [answer.result(timeout=90) for answer in answers]
        accepted = metric_total(server.url, "retrieval_monitor_events_accepted_total")
        rejected = metric_total(server.url, "retrieval_monitor_events_rejected_total")
    assert Counter(r.status_code for r in responses) == {202: WAITING_REQUESTS - 2, 200: 1, 409: 1}
    by_id = Counter((r.json()["event_id"], r.status_code) for r in responses if r.status_code < 300)
    assert by_id[("same", 202)] == by_id[("same", 200)] == by_id[("reused", 202)] == 1
    assert all(by_id[(f"e{i}", 202)] == 1 for i in range(WAITING_REQUESTS - 4))
    conflict = next(r for r in responses if r.status_code == 409)
    assert conflict.json()["detail"] == "event_id already used for a different event"
    assert count_rows(settings, Event) == WAITING_REQUESTS - 2
    assert accepted == WAITING_REQUESTS - 2
    assert rejected == 1


def test_a_request_that_stops_waiting_leaves_its_group_to_be_stored(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    """A wait past its bound is a 503 "unconfirmed"; the event is still committed with the rest
    of its group, whose other requests get their outcomes."""
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    runtime = Runtime(settings)
    ingestor = Ingestor(runtime, JudgeQueue(settings.redis_url, settings.queue_name))
    held = HeldCommitter(ingestor.ingest, capacity=10)

    async def scenario() -> tuple[NotStoredError, str]:
        impatient = asyncio.create_task(held.store("a", event("e1"), timeout=0.2))
        patient = asyncio.create_task(held.store("a", event("e2")))
        await asyncio.sleep(0)  # each task queues its event: both before the writer starts
        assert held.submitted == 2
        held.start()
        with pytest.raises(NotStoredError) as gave_up:
            await impatient
        assert held.entered.wait(10)  # the writer holds both events, at the gate
        assert not patient.done()
        held.gate.set()
        return gave_up.value, (await patient).status

    error, other_status = asyncio.run(scenario())
    held.close()
    assert (error.reason, error.status_code) == ("unconfirmed", 503)
    assert "retry with the same event_id" in str(error)
    assert other_status == "accepted"
    assert count_rows(settings, Event) == 2
