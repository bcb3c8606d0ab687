"""Sending judge tasks by name: the service never imports the workers' code."""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import uuid
from collections.abc import Iterable, Sequence

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


def judge_message(task: str, event_pks: Sequence[int], queue: str) -> bytes:
    """A Celery (protocol 2, JSON) message asking ``task`` of ``event_pks``, as a Redis broker
    keeps it in the list named ``queue``; a worker reads it exactly as one Celery sent.

    Built here rather than by ``Celery.send_task``: kombu's publish cost ~1.6 ms of CPU and
    several Redis round trips per message, more than storing the events it names; this one is
    a string and a single LPUSH that can share the round trip of the request's counters.
    """
    task_id = str(uuid.uuid4())
    args = [list(event_pks)]
    body = [args, {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
    message = {
        "body": base64.b64encode(json.dumps(body).encode()).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": task,
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": repr(args),
            "kwargsrepr": "{}",
            "origin": _ORIGIN,
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": None,
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": 0,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return json.dumps(message).encode()


_ORIGIN = f"{os.getpid()}@{socket.gethostname()}"


class TaskSender:
    def __init__(self, broker_url: str, queue: str, slice_events: int = 16) -> None:
        self.broker_url = broker_url
        self.queue = queue
        self.slice_events = slice_events
        # A broker outage must not hang the ingest request: the event is already committed and
        # the sweeper re-enqueues it, so one quick attempt with a bounded wait is enough.
        self.redis = Redis.from_url(broker_url, socket_timeout=5, socket_connect_timeout=5)

    def close(self) -> None:
        """Send anything held back (this sender holds nothing)."""

    def judge_messages(self, event_pks: Sequence[int], queue: str | None = None) -> list[bytes]:
        """The messages for ``queue`` (default: this sender's) that ask judging of
        ``event_pks``: none, or one.

        A request costs one message: up to a slice goes straight to a judge task; a larger
        batch goes to a worker that cuts it into slices, so several processes share it.
        """
        if not event_pks:
            return []
        name = JUDGE_SLICE_TASK if len(event_pks) <= self.slice_events else FANOUT_TASK
        return [judge_message(name, event_pks, queue or self.queue)]

    def sends_now(self, event_pks: Sequence[int]) -> bool:
        """Whether ``send_judge(event_pks)`` would go to the broker at once (a caller may then
        push ``judge_messages`` itself, in a round trip it makes anyway)."""
        return True

    def send_judge(self, event_pks: Sequence[int]) -> bool:
        """Enqueue judging; False if the broker refused (the sweeper will retry)."""
        messages = self.judge_messages(event_pks)
        if not messages:
            return True
        try:
            self.redis.lpush(self.queue, *messages)
        except Exception:  # the event is committed; losing the send only delays judging
            log.warning(
                "could not enqueue %d judge task(s); the sweeper will",
                len(event_pks),
                exc_info=True,
            )
            return False
        return True
