"""Celery's own publishing, for brokers other than Redis (RabbitMQ, say)."""

from __future__ import annotations

from celery import Celery

from service.queue.broker import CONNECT_SECONDS


def celery_sender(broker_url: str) -> Celery:
    """A Celery app that only publishes to ``broker_url``, with bounded waits: the events are
    committed, and what it fails to send the sweeper sends."""
    sender = Celery("retrieval-monitor-sender", broker=broker_url, set_as_current=False)
    sender.conf.update(
        broker_connection_timeout=CONNECT_SECONDS,
        task_publish_retry_policy={
            "max_retries": 1,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 0.5,
        },
    )
    return sender
