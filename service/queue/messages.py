"""The judge message on the wire: written here in Celery's own format (protocol 2, JSON) for a
Redis broker's list, and read back from a queue's list to find which events still wait.

A test holds the message to what Celery itself writes, field by field.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import uuid
from collections.abc import Iterable, Sequence

from redis import Redis

from service.queue.tasks import FANOUT_TASK, JUDGE_SLICE_TASK, JUDGE_TASK

# Tasks whose first argument is an event's key, or a list of them.
_EVENT_TASKS = frozenset({JUDGE_TASK, JUDGE_SLICE_TASK, FANOUT_TASK})
# How many messages one LRANGE reads while the waiting events are collected.
_SCAN_CHUNK = 1000


def slices(event_pks: Sequence[int], size: int) -> list[list[int]]:
    """``event_pks`` cut into consecutive slices of at most ``size``."""
    return [list(event_pks[i : i + size]) for i in range(0, len(event_pks), size)]


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


# Celery's own form of a sender's name (``celery.utils.nodenames.anon_nodename``).
_ORIGIN = f"gen{os.getpid()}@{socket.gethostname()}"
