"""The bounded hand-off between the application's threads and the sender, and its counters.

Invariant, at every moment: ``recorded + feedback == accepted + duplicate + feedback_sent +
rejected + failed + dropped + pending``. Everything the application handed over is in exactly one
of those states; ``pending`` (queued or being sent) never exceeds the capacity, which is what
keeps memory bounded while the monitor is down.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from retrieval_monitor_client.wire import EventRecord, FeedbackRecord

Item = EventRecord | FeedbackRecord


@dataclass(frozen=True)
class Stats:
    """What became of everything handed to the client, as of one moment."""

    recorded: int
    """Events handed to ``record()``."""
    feedback: int
    """Feedback handed to ``feedback()``."""
    accepted: int
    """Events the monitor stored."""
    duplicate: int
    """Events the monitor already had: a resend after an answer was lost, counted once there."""
    feedback_sent: int
    """Feedback the monitor recorded."""
    rejected: int
    """Events or feedback the monitor refused (or that were not JSON); reported, never retried."""
    failed: int
    """Given up: the monitor refused the whole request (a bad key, a server error that persisted),
    or it was still unsent when ``close()`` ran out of time."""
    dropped: int
    """Not kept: the queue was full (the monitor down or slow), or the client was closed."""
    retries: int
    """Requests sent again after a 429, a 503 or an unreachable monitor."""
    pending: int
    """Queued or being sent."""


class Outbox:
    """A FIFO of records, bounded by ``capacity``; the sender settles them in the same order."""

    def __init__(self, capacity: int, batch_size: int) -> None:
        self.capacity = capacity
        self.batch_size = batch_size
        self.items: deque[Item] = deque()
        self.wake = threading.Event()
        """Set when a batch is full or a flush is wanted; the sender otherwise wakes on a timer."""
        self._lock = threading.Lock()
        self._settled_changed = threading.Condition(self._lock)
        self._admitted = 0
        self._settled = 0
        self.recorded = 0
        self.feedback = 0
        self.accepted = 0
        self.duplicate = 0
        self.feedback_sent = 0
        self.rejected = 0
        self.failed = 0
        self.dropped = 0
        self.retries = 0

    def put(self, item: Item) -> bool:
        """Queue ``item`` unless the outbox is full; never waits for the sender."""
        with self._lock:
            if isinstance(item, EventRecord):
                self.recorded += 1
            else:
                self.feedback += 1
            if self._admitted - self._settled >= self.capacity:
                self.dropped += 1
                return False
            self._admitted += 1
            self.items.append(item)
        if len(self.items) >= self.batch_size:
            self.wake.set()
        return True

    def refuse(self, item: Item) -> None:
        """Count ``item`` as dropped without queueing it (the client is closed)."""
        with self._lock:
            if isinstance(item, EventRecord):
                self.recorded += 1
            else:
                self.feedback += 1
            self.dropped += 1

    def take_all(self) -> list[Item]:
        """Everything still queued, taken off the queue for the caller to settle."""
        taken: list[Item] = []
        while self.items:
            taken.append(self.items.popleft())
        return taken

    def settle(
        self,
        *,
        accepted: int = 0,
        duplicate: int = 0,
        feedback_sent: int = 0,
        rejected: int = 0,
        failed: int = 0,
    ) -> None:
        """Record the outcome of records taken off the queue, oldest first."""
        with self._lock:
            self.accepted += accepted
            self.duplicate += duplicate
            self.feedback_sent += feedback_sent
            self.rejected += rejected
            self.failed += failed
            self._settled += accepted + duplicate + feedback_sent + rejected + failed
            self._settled_changed.notify_all()

    def mark(self) -> int:
        """A position in the queue: everything admitted so far is settled once it is reached."""
        with self._lock:
            return self._admitted

    def wait_settled(self, mark: int, timeout: float | None) -> bool:
        with self._settled_changed:
            return self._settled_changed.wait_for(lambda: self._settled >= mark, timeout)

    def stats(self) -> Stats:
        with self._lock:
            return Stats(
                recorded=self.recorded,
                feedback=self.feedback,
                accepted=self.accepted,
                duplicate=self.duplicate,
                feedback_sent=self.feedback_sent,
                rejected=self.rejected,
                failed=self.failed,
                dropped=self.dropped,
                retries=self.retries,
                pending=self._admitted - self._settled,
            )
