"""The judge message the API writes by hand for a Redis broker is the message Celery itself
writes, field by field, so a Celery or kombu upgrade that changes the format fails here instead
of leaving the workers unable to read the queue; and on RabbitMQ the same push goes through
Celery's own publishing and reaches the queue.

Tests ``service.queue.messages``, ``service.queue.broker`` and ``service.queue.celery_sender``.
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
import redis
from celery import Celery

from service.ingest.judge_queue import JudgeQueue
from service.queue.broker import BrokerQueues
from service.queue.messages import judge_message
from service.queue.names import urgent_queue
from service.queue.tasks import FANOUT_TASK, JUDGE_SLICE_TASK
from tests.support.live import wait_for

# Fields that differ between any two messages, or name their sender: compared by form only.
PER_MESSAGE = {
    ("headers", "id"),
    ("headers", "root_id"),
    ("properties", "correlation_id"),
    ("properties", "delivery_tag"),
}
PER_SENDER = {("properties", "reply_to")}  # the sending app's reply address; no result is read


def celery_written(redis_url: str, task: str, event_pks: list[int], queue: str) -> bytes:
    """What Celery itself pushes to the Redis list ``queue`` for ``task(event_pks)``."""
    sender = Celery("reference", broker=redis_url, set_as_current=False)
    try:
        sender.send_task(task, args=[event_pks], queue=queue)
    finally:
        sender.close()
    raw = redis.Redis.from_url(redis_url).lpop(queue)
    assert isinstance(raw, bytes)
    return raw


def flatten(value: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    if isinstance(value, dict):
        found: dict[tuple[str, ...], Any] = {}
        for key, inner in value.items():
            found.update(flatten(inner, (*path, key)))
        return found or {path: {}}
    return {path: value}


@pytest.mark.parametrize("task", [JUDGE_SLICE_TASK, FANOUT_TASK])
def test_the_hand_made_message_is_celerys_own_field_by_field(redis_url: str, task: str) -> None:
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    pks = [3, 1, 2]
    theirs = json.loads(celery_written(redis_url, task, pks, queue))
    ours = json.loads(judge_message(task, pks, queue))
    their_body = json.loads(base64.b64decode(theirs.pop("body")))
    our_body = json.loads(base64.b64decode(ours.pop("body")))
    assert our_body == their_body  # args, kwargs and the embedded callbacks, exactly
    their_fields, our_fields = flatten(theirs), flatten(ours)
    assert set(our_fields) == set(their_fields)  # no field added, none missing
    for field, value in their_fields.items():
        if field in PER_MESSAGE:
            uuid.UUID(our_fields[field])  # a fresh id of the same form
        elif field not in PER_SENDER:
            assert our_fields[field] == value, field
    # One task id throughout, as Celery writes it.
    for message in (theirs, ours):
        assert message["headers"]["id"] == message["headers"]["root_id"]
        assert message["headers"]["id"] == message["properties"]["correlation_id"]


def test_on_rabbitmq_the_push_is_published_through_celery(rabbitmq_server_url: str) -> None:
    queue = f"judge-test-{uuid.uuid4().hex[:8]}"
    sender = JudgeQueue(rabbitmq_server_url, queue, slice_events=2)
    queues = BrokerQueues(rabbitmq_server_url)
    try:
        assert sender.redis is None  # no hand-made message on AMQP
        assert sender.push([1, 2, 3], urgent_pks=[4])
        depths = {queue: 1, urgent_queue(queue): 1}
        wait_for(lambda: queues.depths(list(depths)) == depths, timeout=10)
    finally:
        sender.close()


def test_a_broker_that_does_not_answer_leaves_the_push_to_the_sweeper() -> None:
    sender = JudgeQueue("amqp://guest:guest@127.0.0.1:1//", "judge-test-down")
    try:
        assert sender.push([1]) is False  # refused quickly, not raised: the event is committed
    finally:
        sender.close()
