"""The Celery application of the workers, configured so that an accepted event is never lost.

- ``task_acks_late`` + ``task_reject_on_worker_lost``: a task is acknowledged only after it ran,
  and one whose worker died is delivered again (tasks are idempotent, so that is safe).
- ``worker_prefetch_multiplier = 1``: a worker holds only what it is working on, so a killed
  worker strands at most one task per process (and the sweeper catches even that).
- the sweep goes to the urgent queue, so a backlog in the main queue never holds it back.
- ``visibility_timeout`` longer than any task: Redis redelivers an unacknowledged task only after
  this long, so it must exceed the slowest judge call with all its retries.
- a worker survives losing Redis while it holds a task: see ``_connparams_while_attached``.
- the broker is ``RM_BROKER_URL`` (RabbitMQ, or another Redis) when set. RabbitMQ redelivers a
  task as soon as the connection of the worker holding it closes, so the visibility timeout does
  not apply there; its own ``consumer_timeout`` (30 minutes by default) closes the channel of a
  task held longer, which the slowest judge call with all its retries (15 minutes with the
  default settings) stays under.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from celery.signals import worker_init
from kombu.transport import redis as redis_transport
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from service.config.settings import get_settings
from service.queue.broker import is_redis_url
from service.queue.names import urgent_queue
from service.queue.redis_check import eviction_problem
from service.queue.tasks import JUDGE_SLICE_TASK, JUDGE_TASK, KEEP_DAYS_TASK, PURGE_TASK, SWEEP_TASK
from service.store.db_check import warn_if_statistics_go_stale
from service.store.engine import make_engine

VISIBILITY_TIMEOUT_SECONDS = 3600

_RedisChannel: Any = redis_transport.Channel
_connparams: Any = _RedisChannel._connparams


def _connparams_while_attached(self: Any, asynchronous: bool = False) -> Any:
    """The Redis transport's connection parameters, or a broker connection error once the
    channel's transport is detached from its connection.

    When Redis goes away while the worker holds a task, the consumer detaches the transport of
    the broken connection and then closes the channel, which hands the held task back; once it
    has reconnected, the task ends and its acknowledgement goes to that old channel. Both need a
    Redis client of the detached transport. Reading its parameters would raise AttributeError,
    which no caller expects and which stops the worker (its scheduler with it: nothing is judged
    until it is started again). A connection error is what each caller handles as the broker's
    loss: the channel is dropped, the acknowledgement logged as failed, and the worker goes on
    with its new connection. The task's event is still pending in the database, so the sweeper
    sends it again (a task Redis kept is delivered again after the visibility timeout, and finds
    its event judged).
    """
    transport = self.connection
    if transport is None or transport.client is None:
        raise RedisConnectionError("the channel's broker connection is closed")
    return _connparams(self, asynchronous)


_RedisChannel._connparams = _connparams_while_attached


def make_celery() -> Celery:
    settings = get_settings()
    app = Celery("retrieval-monitor", broker=settings.judge_broker_url, include=["workers.tasks"])
    app.conf.update(
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_default_queue=settings.queue_name,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": VISIBILITY_TIMEOUT_SECONDS},
        task_time_limit=VISIBILITY_TIMEOUT_SECONDS - 60,
        task_soft_time_limit=VISIBILITY_TIMEOUT_SECONDS - 120,
        worker_hijack_root_logger=False,
        beat_schedule={
            "sweep-pending-events": {
                "task": SWEEP_TASK,
                "schedule": settings.sweep_interval_seconds,
                # The urgent queue: behind a backlog in the main queue, the sweep (which sheds
                # that backlog and recovers lost events) would wait for the backlog itself.
                "options": {"queue": urgent_queue(settings.queue_name)},
            },
            "purge-texts-past-retention": {
                "task": PURGE_TASK,
                "schedule": 3600.0,
                "options": {"queue": settings.queue_name},
            },
            # The partitions of the next days, and the days past RM_KEEP_EVENTS_DAYS dropped.
            "keep-event-days": {
                "task": KEEP_DAYS_TASK,
                "schedule": 3600.0,
                "options": {"queue": urgent_queue(settings.queue_name)},
            },
        },
        task_routes={
            JUDGE_TASK: {"queue": settings.queue_name},
            JUDGE_SLICE_TASK: {"queue": settings.queue_name},
        },
    )
    return app


app = make_celery()


@worker_init.connect  # type: ignore[untyped-decorator]
def refuse_an_evicting_broker(**_kwargs: object) -> None:
    """The Redis of the aggregates, and the broker when it is another Redis: either one evicting
    keys would drop queued tasks or the once-only markers."""
    settings = get_settings()
    urls = {settings.redis_url, settings.judge_broker_url}
    for url in sorted(url for url in urls if is_redis_url(url)):
        problem = eviction_problem(Redis.from_url(url))
        if problem is not None:
            raise SystemExit(f"retrieval-monitor worker refuses to start: {problem}")


@worker_init.connect  # type: ignore[untyped-decorator]
def warn_about_stale_statistics(**_kwargs: object) -> None:
    # Its own engine, closed before the pool forks: no connection is shared with a child.
    engine = make_engine(get_settings().database_url)
    try:
        warn_if_statistics_go_stale(engine)
    finally:
        engine.dispose()
