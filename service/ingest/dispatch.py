"""Judge messages for small requests, gathered: the events of requests that arrive close together
go to the workers in one message of up to a slice.

A worker judges a slice at a fixed cost plus a small cost per event (one load, one transaction,
one export), so a message per single-event request made a steady trickle of events cost several
times the CPU of the same events in slices, and the judging lag grew from queueing behind that
overhead. Waiting a fraction of a second to gather them costs that fraction in lag.

The events are committed before they are handed over here; a message that is never sent (the
process killed while it waits, the broker down) leaves them pending, and the sweeper sends them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from service.ingest.judge_queue import TaskSender

log = logging.getLogger(__name__)


class GatheringSender(TaskSender):
    """A ``TaskSender`` that holds small sends for up to ``delay_seconds`` to gather them."""

    def __init__(
        self, broker_url: str, queue: str, slice_events: int, delay_seconds: float
    ) -> None:
        super().__init__(broker_url, queue, slice_events)
        self.delay_seconds = delay_seconds
        self._held: list[int] = []
        self._lock = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def sends_now(self, event_pks: Sequence[int]) -> bool:
        return self.delay_seconds <= 0 or len(event_pks) >= self.slice_events

    def send_judge(self, event_pks: Sequence[int]) -> bool:
        if self.sends_now(event_pks):
            return super().send_judge(event_pks)
        with self._lock:
            if self._closed:
                return super().send_judge(event_pks)
            self._held.extend(event_pks)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="judge-dispatch", daemon=True
                )
                self._thread.start()
            # Wakes the thread: to start the wait for company, or to send a full slice now.
            self._lock.notify()
        # Handed over: the flush reports its own failures, and the sweeper covers them.
        return True

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._held and not self._closed:
                    self._lock.wait()
                deadline = time.monotonic() + self.delay_seconds
                while len(self._held) < self.slice_events and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(left)
                if self._closed or len(self._held) < self.slice_events:
                    held, self._held = self._held, []  # the wait is over: everything goes
                else:  # whole slices go now; the rest waits for more company
                    whole = len(self._held) - len(self._held) % self.slice_events
                    held, self._held = self._held[:whole], self._held[whole:]
                closed = self._closed
            self._send(held)
            if closed:
                return

    def _send(self, held: list[int]) -> None:
        for start in range(0, len(held), self.slice_events):
            super().send_judge(held[start : start + self.slice_events])

    def close(self) -> None:
        """Send what is held now (at shutdown)."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._lock.notify()
        if thread is not None:
            thread.join(timeout=10)
        with self._lock:
            held, self._held = self._held, []
        self._send(held)
