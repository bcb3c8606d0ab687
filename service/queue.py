"""Sending judge tasks by name: the service never imports the workers' code."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import Celery

JUDGE_TASK = "judge.event"
JUDGE_SLICE_TASK = "judge.events"
FANOUT_TASK = "judge.fanout"
SWEEP_TASK = "events.sweep"
PURGE_TASK = "events.purge"

log = logging.getLogger(__name__)


def slices(event_pks: Sequence[int], size: int) -> list[list[int]]:
    """``event_pks`` cut into consecutive slices of at most ``size``."""
    return [list(event_pks[i : i + size]) for i in range(0, len(event_pks), size)]


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
