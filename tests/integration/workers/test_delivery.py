"""Delivery of judge tasks: Celery keeps a task until it ran, a task whose process died runs
again without the sweeper, a backlog older than the requeue time is not sent twice, two
deliveries of one event pay for one judge call, and an export lost after the commit is made by
the next delivery, once; a claim outlives a judge call longer than its lifetime.

Tests ``workers.celery_app``, ``workers.tasks``, ``workers.claims``, ``service.queue.tasks`` and
``service.telemetry.judged_export``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from service.config.settings import Settings
from service.queue.broker import BrokerQueues
from service.queue.messages import waiting_event_pks
from service.queue.tasks import JUDGE_SLICE_TASK
from service.telemetry.aggregates import DONE_TTL_SECONDS, Aggregates
from tests.support.database import db_scalar, judged_and_exported
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event, store_event
from tests.support.live import FakeJudged, WorkerFactory, WorkerProcess, wait_for

pytestmark = pytest.mark.slow


def counter(redis_url: str, family: str) -> float:
    return sum(
        value
        for (name, _labels, part), value in Aggregates(redis.Redis.from_url(redis_url))
        .read()
        .items()
        if name == family and part == ""
    )


def test_a_channel_of_a_lost_broker_connection_fails_as_a_connection_error(
    redis_url: str,
) -> None:
    """Redis gone while the worker holds a task: the consumer detaches the transport of the
    broken connection, then closes its channel, which hands the held task back, and later acks
    the task on that channel. Both meet no connection, and fail as broker connection errors (the
    consumer's close ignores them, the ack logs them) instead of the AttributeErrors that
    stopped the worker."""
    import kombu.connection

    import workers.celery_app  # noqa: F401  (the worker's transport, as the worker loads it)

    broker: Any = kombu.connection.Connection
    connection = broker(redis_url)
    lost = connection.connection_errors
    channel = connection.default_channel
    channel.qos._delivered["held"] = object()  # a task the worker holds, not yet acknowledged
    connection._do_close_transport()  # what closing the broken connection does first
    with pytest.raises(lost):  # was AttributeError: 'NoneType' object has no attribute 'hostname'
        channel.close()
    channel.connection = None  # the channel once its transport has let it go
    with pytest.raises(lost):  # was AttributeError: 'NoneType' object has no attribute 'client'
        channel.qos.ack("held")


def test_celery_keeps_a_task_until_it_ran() -> None:
    from workers.celery_app import VISIBILITY_TIMEOUT_SECONDS, app
    from workers.tasks import MAX_COUNTDOWN_SECONDS

    conf = app.conf
    assert conf.task_acks_late is True  # acknowledged after the task, not when taken
    assert conf.task_reject_on_worker_lost is True  # a task whose process died goes back
    assert conf.worker_prefetch_multiplier == 1  # a killed worker strands one task per process
    assert conf.broker_transport_options["visibility_timeout"] == VISIBILITY_TIMEOUT_SECONDS
    # Redis redelivers an unacknowledged task after the visibility timeout: no task may run
    # that long, nor wait that long for a retry, or it would run twice.
    assert conf.task_soft_time_limit < conf.task_time_limit < VISIBILITY_TIMEOUT_SECONDS
    assert MAX_COUNTDOWN_SECONDS < VISIBILITY_TIMEOUT_SECONDS
    # The once-only export marker outlives every second delivery Celery can make.
    assert VISIBILITY_TIMEOUT_SECONDS + MAX_COUNTDOWN_SECONDS < DONE_TTL_SECONDS
    slowest_call = Settings().judge_timeout_seconds * (Settings().judge_max_retries + 1)
    assert slowest_call * (Settings().judge_malformed_retries + 1) < conf.task_soft_time_limit


def pool_processes(worker: WorkerProcess) -> list[int]:
    """The Celery pool processes (children) of a worker's main process."""
    assert worker.process is not None
    pid = worker.process.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children]


def test_a_pool_process_killed_mid_task_is_redelivered_without_the_sweeper(
    redis_url: str,
    broker_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    import os
    import signal

    # No scheduler runs, and its requeue time is far away: only Celery can bring the task back.
    settings = fake_judged(pending_requeue_seconds=3600, broker_url=broker_url)
    fake_llm.set_labels({(None, "passage number 1 about topic 1"): 3})
    fake_llm.set_fault("slow", count=1, delay=60)  # the first call hangs: kill during it
    worker = worker_factory(settings, concurrency=1).start()
    (child,) = pool_processes(worker)
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events", json=make_event("killed", n=2)).status_code == 202
        wait_for(lambda: fake_llm.stats()["calls"] >= 1, timeout=60)
        os.kill(child, signal.SIGKILL)
        wait_for(lambda: judged_and_exported(settings) == 1, timeout=90)
    assert fake_llm.stats()["calls"] == 2  # the killed call, and the redelivered one
    assert db_scalar(settings, "SELECT count(*) FROM scores") == 1
    assert counter(redis_url, "events_judged") == 1
    assert "WorkerLostError" in worker.log_path.read_text()


def test_two_deliveries_of_one_event_at_once_make_one_judge_call(
    redis_url: str,
    broker_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    settings = fake_judged(broker_url=broker_url)
    _runtime, pk = store_event(settings, "twice", "a question", ["first text", "second text"], 2)
    fake_llm.hold()  # the first delivery's call stays in flight until released
    worker = worker_factory(settings, concurrency=2).start()
    sender = Celery(broker=broker_url)
    for _ in range(2):
        sender.send_task(JUDGE_SLICE_TASK, args=[[pk]], queue=settings.queue_name)
    queues = BrokerQueues(broker_url)
    # One call in flight, and the other delivery taken and done with while it is.
    wait_for(lambda: fake_llm.stats()["calls"] == 1, timeout=60)
    wait_for(
        lambda: (
            queues.depths([settings.queue_name])[settings.queue_name] == 0
            and _finished_tasks(worker, JUDGE_SLICE_TASK) == 1
        ),
        timeout=60,
    )
    fake_llm.release()
    wait_for(lambda: db_scalar(settings, "SELECT count(*) FROM scores") == 1, timeout=60)
    wait_for(lambda: counter(redis_url, "events_judged") == 1, timeout=30)
    assert fake_llm.stats()["calls"] == 1
    assert db_scalar(settings, "SELECT count(*) FROM judge_runs") == 1


def test_a_judge_call_longer_than_the_claim_lifetime_is_not_asked_again(
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    """A claim lives one requeue time (1 s here) and its holder renews it while it judges: a
    second delivery arriving long after that, while the 4 s call is still running, finds the
    event claimed and leaves it alone."""
    settings = fake_judged(pending_requeue_seconds=1)
    _runtime, pk = store_event(settings, "long", "a question", ["first text", "second text"], 2)
    fake_llm.hold()  # the call lasts until released, however slow the machine
    worker_factory(settings, concurrency=2).start()
    sender = Celery(broker=redis_url)
    sender.send_task(JUDGE_SLICE_TASK, args=[[pk]], queue=settings.queue_name)
    wait_for(lambda: fake_llm.stats()["calls"] == 1, timeout=60)
    # At least twice the claim's lifetime (a sleep never ends early): unrenewed, it would have
    # expired by now, and the held call cannot have ended.
    time.sleep(2.0)
    claim_keys = redis.Redis.from_url(redis_url).keys("judging:*")
    assert len(claim_keys) == 1  # still held
    sender.send_task(JUDGE_SLICE_TASK, args=[[pk]], queue=settings.queue_name)
    client = redis.Redis.from_url(redis_url)
    # The second delivery taken and done with while the call is still held.
    wait_for(
        lambda: client.llen(settings.queue_name) == 0 and client.hlen("unacked") == 1, timeout=60
    )
    fake_llm.release()
    wait_for(lambda: db_scalar(settings, "SELECT count(*) FROM scores") == 1, timeout=60)
    wait_for(lambda: counter(redis_url, "events_judged") == 1, timeout=30)
    assert fake_llm.stats()["calls"] == 1
    assert client.keys("judging:*") == []  # released once stored


def test_a_backlog_older_than_the_requeue_time_is_not_sent_again(
    broker_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    """Events wait in the queue far longer than the requeue time while sweeps run every half
    second: none is sent again, the queue only shrinks, and each event costs one judge call."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app

    events = 16
    settings = fake_judged(
        pending_requeue_seconds=1,
        sweep_interval_seconds=0.5,
        judge_gather_seconds=0,  # one message per event
        broker_url=broker_url,
    )
    fake_llm.set_fault("slow", count=None, delay=0.7)  # one process judges 1.4 events a second
    queues = BrokerQueues(broker_url)

    def waiting() -> int:
        return queues.depths([settings.queue_name])[settings.queue_name]

    with TestClient(create_app(settings)) as api:
        for i in range(events):
            assert api.post("/v1/events", json=make_event(f"b{i}", query=f"q {i}")).status_code
        wait_for(lambda: waiting() == events, timeout=10)  # AMQP counts a publish a moment late
        # The whole backlog is older than the requeue time before any worker looks at it.
        stale_from = time.monotonic() + settings.pending_requeue_seconds
        wait_for(lambda: time.monotonic() > stale_from, timeout=30)
        worker = worker_factory(settings, concurrency=1, with_scheduler=True).start()
        depths: list[tuple[int, int]] = []  # (messages waiting, events pending)
        sweeps_with_a_stale_backlog = 0

        def judged_all() -> bool:
            nonlocal sweeps_with_a_stale_backlog
            pending = db_scalar(settings, "SELECT count(*) FROM events WHERE status='pending'")
            depths.append((waiting(), pending))
            if pending > events // 2:
                sweeps_with_a_stale_backlog = _finished_tasks(worker, "events.sweep")
            return pending == 0

        wait_for(judged_all, timeout=120, interval=0.1)
    # The sweeper really ran while most of the backlog was older than the requeue time.
    assert sweeps_with_a_stale_backlog >= 2, worker.log_path.read_text()[-2000:]
    # Every waiting message names a pending event: no copy joined the queue.
    assert all(depth <= pending for depth, pending in depths), depths
    assert max(depth for depth, _ in depths) <= events
    assert fake_llm.stats()["calls"] == events
    assert db_scalar(settings, "SELECT count(*) FROM scores") == events


def test_waiting_events_are_read_from_the_queue(redis_url: str) -> None:
    sender = Celery(broker=redis_url)
    sender.send_task(JUDGE_SLICE_TASK, args=[[1, 2, 3]], queue="q-read")
    sender.send_task("judge.event", args=[7], queue="q-read")
    sender.send_task("judge.fanout", args=[[8, 9]], queue="q-read.urgent")
    sender.send_task("events.sweep", queue="q-read")
    client = redis.Redis.from_url(redis_url)
    client.lpush("q-read", b"not a message")
    assert waiting_event_pks(client, ["q-read", "q-read.urgent", "absent"]) == {1, 2, 3, 7, 8, 9}


@pytest.fixture
def llm_store_settings(
    tmp_path: Path, store_url: str, redis_url: str, fake_llm: FakeLLM
) -> Settings:
    return make_settings(tmp_path, store_url, redis_url, judge_base_url=fake_llm.base_url)


def test_an_export_lost_after_the_commit_is_made_once_by_the_next_delivery(
    llm_store_settings: Settings, fake_llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    from workers import judging
    from workers.judge import make_judge

    settings = llm_store_settings
    fake_llm.set_labels({(None, "first text"): 3})
    runtime, pk = store_event(settings, "crash", "a question", ["first text", "second text"], 2)
    judge = make_judge(settings, runtime.redis)

    def lost(*_args: object, **_kwargs: object) -> list[bool]:
        raise redis.ConnectionError("the connection dropped before the export")

    # The process dies between the commit of the score and the export to Redis.
    with monkeypatch.context() as patch:
        patch.setattr(runtime.aggregates, "add_many_once", lost)
        with pytest.raises(redis.ConnectionError):
            judging.judge_events(runtime, judge, [pk])
    assert db_scalar(settings, "SELECT count(*) FROM scores") == 1
    assert counter(settings.redis_url, "events_judged") == 0
    # Redelivered, twice: the stored score is exported by the first, and only by it.
    for _ in range(2):
        assert judging.judge_events(runtime, judge, [pk]).outcomes == {pk: "already_judged"}
    assert fake_llm.stats()["calls"] == 1  # the redelivery did not ask the judge again
    assert counter(settings.redis_url, "events_judged") == 1
    assert counter(settings.redis_url, "judge_labels") == 2
    families = {name for name, _labels, _part in runtime.aggregates.read()}
    measure_counts = [
        value
        for (name, _labels, part), value in runtime.aggregates.read().items()
        if name.startswith("measure_") and part == "count"
    ]
    assert measure_counts, families
    assert set(measure_counts) == {1}


def test_the_export_marker_is_what_stops_a_second_count(
    llm_store_settings: Settings, fake_llm: FakeLLM
) -> None:
    """The control for the test above: without its marker, a redelivery counts the event again."""
    from service.telemetry.aggregates import DONE_PREFIX
    from service.telemetry.judged_export import done_key
    from workers import judging
    from workers.judge import make_judge

    settings = llm_store_settings
    runtime, pk = store_event(settings, "control", "a question", ["first text"], 1)
    judge = make_judge(settings, runtime.redis)
    judging.judge_events(runtime, judge, [pk])
    assert counter(settings.redis_url, "events_judged") == 1
    who = judge.identity
    runtime.redis.delete(DONE_PREFIX + done_key(pk, who.judge, who.prompt_version))
    judging.judge_events(runtime, judge, [pk])
    assert counter(settings.redis_url, "events_judged") == 2


def test_a_judge_down_past_the_last_retry_marks_the_event_failed_and_counts_it_once(
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    fake_judged: FakeJudged,
) -> None:
    from service.queue.tasks import JUDGE_TASK
    from workers.tasks import MAX_TASK_RETRIES

    settings = fake_judged(judge_max_retries=0)
    _runtime, pk = store_event(settings, "down", "a question", ["first text"], 1)
    fake_llm.set_fault("http_500", count=None)
    worker = worker_factory(settings).start()
    sender = Celery(broker=redis_url)
    # The task as it arrives for its last attempt (the earlier ones back off for about an hour).
    sender.send_task(JUDGE_TASK, args=[pk], queue=settings.queue_name, retries=MAX_TASK_RETRIES)
    wait_for(
        lambda: db_scalar(settings, "SELECT count(*) FROM events WHERE status='failed'") == 1,
        timeout=60,
    )
    wait_for(lambda: counter(redis_url, "events_failed") == 1, timeout=30)
    # Delivered once more (a lost acknowledgement): the judge is asked, the count stays.
    sender.send_task(JUDGE_TASK, args=[pk], queue=settings.queue_name, retries=MAX_TASK_RETRIES)
    wait_for(lambda: _finished_tasks(worker, "judge.event") == 2, timeout=60)
    assert fake_llm.stats()["calls"] == 2
    assert counter(redis_url, "events_failed") == 1
    assert counter(redis_url, "judge_failures") == 2
    assert db_scalar(settings, "SELECT count(*) FROM scores") == 0  # failed, never a made-up 0


def _finished_tasks(worker: WorkerProcess, name: str) -> int:
    return sum(
        f"{name}[" in line and "succeeded" in line
        for line in worker.log_path.read_text(errors="replace").splitlines()
    )
