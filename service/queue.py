"""Sending judge tasks by name: the service never imports the workers' code."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import Celery

JUDGE_TASK = "judge.event"
SWEEP_TASK = "events.sweep"

log = logging.getLogger(__name__)


class TaskSender:
    def __init__(self, broker_url: str, queue: str) -> None:
        self.queue = queue
        self.app = Celery("retrieval-monitor-sender", broker=broker_url, set_as_current=False)
        self.app.conf.broker_connection_retry_on_startup = True
        # A broker outage must not hang the ingest request: the event is already committed and
        # the sweeper re-enqueues it, so one quick attempt is enough.
        self.app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0}

    def send_judge(self, event_pks: Sequence[int]) -> bool:
        """Enqueue judging; False if the broker refused (the sweeper will retry)."""
        try:
            with self.app.producer_or_acquire() as producer:
                for pk in event_pks:
                    self.app.send_task(
                        JUDGE_TASK, args=[pk], queue=self.queue, producer=producer, retry=False
                    )
        except Exception:  # the event is committed; losing the send only delays judging
            log.warning(
                "could not enqueue %d judge task(s); the sweeper will",
                len(event_pks),
                exc_info=True,
            )
            return False
        return True
