"""Sending judge tasks by name: the service never imports the workers' code."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterable, Sequence

from celery import Celery
from redis import Redis

JUDGE_TASK = "judge.event"
JUDGE_SLICE_TASK = "judge.events"
FANOUT_TASK = "judge.fanout"
SWEEP_TASK = "events.sweep"
PURGE_TASK = "events.purge"

log = logging.getLogger(__name__)


def slices(event_pks: Sequence[int], size: int) -> list[list[int]]:
    """``event_pks`` cut into consecutive slices of at most ``size``."""
    return [list(event_pks[i : i + size]) for i in range(0, len(event_pks), size)]


# Tasks whose first argument is an event's key, or a list of them.
_EVENT_TASKS = frozenset({JUDGE_TASK, JUDGE_SLICE_TASK, FANOUT_TASK})
# How many messages one LRANGE reads while the waiting events are collected.
_SCAN_CHUNK = 1000


def waiting_event_pks(redis: Redis, queues: Iterable[str]) -> set[int]:
    """The events named by judge messages still waiting in ``queues`` (not yet taken by a worker).

    The broker keeps each queue as a Redis list of JSON messages whose base64 body is the task's
    ``[args, kwargs, embed]``; a message taken by a worker has left the list. Messages that do not
    parse are passed over: at worst their events are sent once more, which the workers absorb.
    """
    found: set[int] = set()
    for queue in queues:
        start = 0
        while True:
            chunk = redis.lrange(queue, start, start + _SCAN_CHUNK - 1)
            for raw in chunk:
                found.update(_event_pks_of(raw))
            if len(chunk) < _SCAN_CHUNK:
                break
            start += _SCAN_CHUNK
    return found


def _event_pks_of(raw: bytes | str) -> list[int]:
    try:
        message = json.loads(raw)
        if message.get("headers", {}).get("task") not in _EVENT_TASKS:
            return []
        args = json.loads(base64.b64decode(message["body"]))[0]
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        return []
    if not args:
        return []
    first = args[0]
    if isinstance(first, int):
        return [first]
    if isinstance(first, list):
        return [pk for pk in first if isinstance(pk, int)]
    return []


def urgent_queue(queue: str) -> str:
    """The queue of gold events and events whose signals look bad; workers consume it too."""
    return f"{queue}.urgent"


class TaskSender:
    def __init__(self, broker_url: str, queue: str, slice_events: int = 16) -> None:
        self.queue = queue
        self.slice_events = slice_events
        self.app = Celery("retrieval-monitor-sender", broker=broker_url, set_as_current=False)
        self.app.conf.broker_connection_retry_on_startup = True
        # A broker outage must not hang the ingest request: the event is already committed and
        # the sweeper re-enqueues it, so one quick attempt is enough.
        self.app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0}

    def close(self) -> None:
        """Send anything held back (this sender holds nothing)."""

    def send_judge(self, event_pks: Sequence[int]) -> bool:
        """Enqueue judging; False if the broker refused (the sweeper will retry)."""
        if not event_pks:
            return True
        # A request costs one message: up to a slice goes straight to a judge task; a larger
        # batch goes to a worker that cuts it into slices, so several processes share it.
        name = JUDGE_SLICE_TASK if len(event_pks) <= self.slice_events else FANOUT_TASK
        args = [list(event_pks)]
        try:
            self.app.send_task(name, args=args, queue=self.queue, retry=False)
        except Exception:  # the event is committed; losing the send only delays judging
            log.warning(
                "could not enqueue %d judge task(s); the sweeper will",
                len(event_pks),
                exc_info=True,
            )
            return False
        return True
