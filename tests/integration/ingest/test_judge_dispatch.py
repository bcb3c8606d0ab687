"""The API gathers the judge messages of small requests into slices: what the broker (the real
Redis) receives, and when.

Tests ``service.ingest.judge_queue``, ``service.ingest.gathering`` and ``service.queue.names``.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections import Counter

import redis

from service.ingest.judge_queue import CounterUpdate, JudgeQueue
from service.queue.names import gathering_since
from service.queue.tasks import FANOUT_TASK, JUDGE_SLICE_TASK
from service.telemetry.aggregates import Aggregates, Delta
from tests.support.live import wait_for
from tests.support.recording_redis import RecordingRedis


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


def test_two_senders_on_one_redis_broker_fill_one_slice_together(redis_url: str) -> None:
    """Two API processes (two senders sharing nothing but the broker) alternate single events:
    the slice fills at their joint rate, and no event goes twice or is left behind."""
    client = redis.Redis.from_url(redis_url)
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    # Timers far longer than the test: only a slice filled across both can make a message go.
    first = JudgeQueue(redis_url, queue, slice_events=4, gather_seconds=60)
    second = JudgeQueue(redis_url, queue, slice_events=4, gather_seconds=60)
    try:
        for pk in range(1, 10):
            assert (first if pk % 2 else second).push([pk])
        assert queued_messages(client, queue) == [
            (JUDGE_SLICE_TASK, [1, 2, 3, 4]),
            (JUDGE_SLICE_TASK, [5, 6, 7, 8]),
        ]
        assert client.lrange(first.gathering_key, 0, -1) == [b"9"]
        # The one left goes with whichever sender's timer fires first: here the first's close.
        first.close()
        assert queued_messages(client, queue)[-1] == (JUDGE_SLICE_TASK, [9])
        assert client.llen(first.gathering_key) == 0
    finally:
        first.close()
        second.close()
        client.delete(queue, first.gathering_key)


def test_an_event_gathered_by_a_process_whose_timer_never_fires_goes_with_anothers(
    redis_url: str,
) -> None:
    """A process that appended and then stopped (killed, or its timer far off) does not strand
    its events: the next timer of any process sharing the list sends them."""
    client = redis.Redis.from_url(redis_url)
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    stalled = JudgeQueue(redis_url, queue, slice_events=16, gather_seconds=3600)
    prompt = JudgeQueue(redis_url, queue, slice_events=16, gather_seconds=0.2)
    try:
        assert stalled.push([1])
        assert prompt.push([2])
        wait_for(lambda: client.llen(queue) > 0, timeout=10)
        assert queued_messages(client, queue) == [(JUDGE_SLICE_TASK, [1, 2])]
    finally:
        prompt.close()
        stalled.close()  # its timer thread; the list is empty by now
        client.delete(queue, stalled.gathering_key)


def test_the_append_goes_in_the_counters_pipeline_and_survives_a_flushed_script_cache(
    redis_url: str,
) -> None:
    """With the counters on the broker's Redis, the append is sent through the counters' client,
    in their pipeline, by the script's SHA (the sender's own client sends nothing); after a
    restarted Redis (its scripts gone) it is made again, not dropped."""
    client = redis.Redis.from_url(redis_url)
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    sender = JudgeQueue(redis_url, queue, slice_events=2, gather_seconds=60)
    counters_client = RecordingRedis(connection_pool=redis.ConnectionPool.from_url(redis_url))
    counters = CounterUpdate(Aggregates(counters_client), redis_url, Delta())
    try:
        assert sender.push([1], counters=counters)
        # Only the append, through the counters' client (the counters' delta is empty here).
        assert counters_client.sent == Counter({"EVALSHA": 1})
        assert client.lrange(sender.gathering_key, 0, -1) == [b"1"]
        client.script_flush()
        assert sender.push([2], counters=counters)
        assert queued_messages(client, queue) == [(JUDGE_SLICE_TASK, [1, 2])]
        assert client.llen(sender.gathering_key) == 0
    finally:
        sender.close()
        client.delete(queue, sender.gathering_key)


def test_a_clock_stepped_back_does_not_hold_the_gathered_events(redis_url: str) -> None:
    """An arrival time in the future (the broker's clock stepped back since) is no reason to
    wait: the timer takes the events at once rather than sleeping for the step."""
    client = redis.Redis.from_url(redis_url)
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    sender = JudgeQueue(redis_url, queue, slice_events=16, gather_seconds=0.2)
    try:
        sender.push([1])
        seconds, micros = client.time()
        an_hour_ahead = (seconds + 3600) * 1000 + micros // 1000
        client.set(gathering_since(queue), an_hour_ahead)
        wait_for(lambda: client.llen(queue) > 0, timeout=10)
        assert queued_messages(client, queue) == [(JUDGE_SLICE_TASK, [1])]
    finally:
        sender.close()
        client.delete(queue, sender.gathering_key, gathering_since(queue))


def test_a_timer_sends_the_gathered_events_once_the_oldest_has_waited_its_time(
    redis_url: str,
) -> None:
    """A slice taken whole does not leave the timer its first event armed to cut the next one
    short: what is left waits its own ``gather_seconds`` (a lower bound, which a slow machine
    can only lengthen)."""
    client = redis.Redis.from_url(redis_url)
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    sender = JudgeQueue(redis_url, queue, slice_events=4, gather_seconds=1.0)
    try:
        for pk in range(1, 5):  # the first arms the timer; the fourth takes the slice whole
            sender.push([pk])
        assert queued_messages(client, queue) == [(JUDGE_SLICE_TASK, [1, 2, 3, 4])]
        time.sleep(0.5)
        pushed = time.monotonic()
        sender.push([5])
        wait_for(lambda: client.llen(queue) > 1, timeout=10)
        waited = time.monotonic() - pushed
        assert queued_messages(client, queue)[-1] == (JUDGE_SLICE_TASK, [5])
        assert waited >= 0.99, f"sent {waited:.3f} s after it arrived, before its 1 s"
    finally:
        sender.close()
        client.delete(queue, sender.gathering_key)
