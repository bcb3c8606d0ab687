"""Sending judge tasks by name: the service never imports the workers' code."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import Celery

JUDGE_TASK = "judge.event"
FANOUT_TASK = "judge.fanout"
SWEEP_TASK = "events.sweep"
PURGE_TASK = "events.purge"

log = logging.getLogger(__name__)


def urgent_queue(queue: str) -> str:
    """The queue of gold events and events whose signals look bad; workers consume it too."""
    return f"{queue}.urgent"


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
        if not event_pks:
            return True
        # A batch costs the request one message: a worker fans it out into one task per event,
        # so each event is still judged, retried and acknowledged on its own.
        name, args = (
            (JUDGE_TASK, [event_pks[0]])
            if len(event_pks) == 1
            else (FANOUT_TASK, [list(event_pks)])
        )
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
