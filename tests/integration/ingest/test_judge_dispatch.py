"""The API gathers the judge messages of small requests into slices: what the broker (the real
Redis) receives, and when."""

from __future__ import annotations

import base64
import json
import uuid

import redis

from service.ingest.judge_queue import FANOUT_TASK, JUDGE_SLICE_TASK, JudgeQueue
from tests.support.live import wait_for


def queued_messages(client: redis.Redis, queue: str) -> list[tuple[str, list[int]]]:
    """(task name, event pks) of every message waiting in ``queue``, oldest first."""
    messages = []
    for raw in reversed(client.lrange(queue, 0, -1)):
        envelope = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(envelope["body"]))
        messages.append((envelope["headers"]["task"], args[0]))
    return messages


def test_small_sends_close_together_become_one_slice(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    sender = JudgeQueue(redis_url, queue, slice_events=16, gather_seconds=0.3)
    try:
        for pk in (1, 2, 3):
            assert sender.push([pk])
        wait_for(lambda: client.llen(queue) > 0, timeout=10)
        assert queued_messages(client, queue) == [(JUDGE_SLICE_TASK, [1, 2, 3])]
        # Later sends start a wait of their own.
        sender.push([4])
        wait_for(lambda: client.llen(queue) > 1, timeout=10)
        assert queued_messages(client, queue)[-1] == (JUDGE_SLICE_TASK, [4])
    finally:
        sender.close()
        client.delete(queue)


def test_a_full_slice_goes_without_waiting_and_a_batch_goes_as_it_is(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    # A delay far longer than the waits below: only a full slice can make these messages go.
    sender = JudgeQueue(redis_url, queue, slice_events=4, gather_seconds=60)
    try:
        for pk in range(1, 6):
            sender.push([pk])
        wait_for(lambda: client.llen(queue) > 0, timeout=10)
        sender.push(list(range(100, 110)))  # a batch's own message
        assert queued_messages(client, queue) == [
            (JUDGE_SLICE_TASK, [1, 2, 3, 4]),
            (FANOUT_TASK, list(range(100, 110))),
        ]
        # The fifth event is still held, and goes when the sender closes (shutdown).
        sender.close()
        assert queued_messages(client, queue)[-1] == (JUDGE_SLICE_TASK, [5])
    finally:
        sender.close()
        client.delete(queue)


def test_without_a_delay_every_send_goes_at_once(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    sender = JudgeQueue(redis_url, queue, slice_events=16, gather_seconds=0)
    try:
        sender.push([1])
        sender.push([2])
        assert queued_messages(client, queue) == [(JUDGE_SLICE_TASK, [1]), (JUDGE_SLICE_TASK, [2])]
    finally:
        client.delete(queue)
