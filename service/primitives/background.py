"""One daemon thread that takes items from any thread and hands them on in flushes.

A request that produced something for a later, slower consumer (a Redis call, a count made after
the answer) puts it here and goes on; the thread hands what was put to ``flush`` on a schedule:

- every ``interval_seconds`` (``wait_for_work=False``: a steady tick, whether anything came);
- or ``interval_seconds`` after work arrives to an idle worker (``wait_for_work=True``), earlier
  once ``batch`` items are in: then the whole batches go and the rest keeps waiting;
- on ``flush()`` from another thread (one flush runs at a time: the thread's or the caller's);
- on ``close()``, which also stops the thread; what is put after it is refused (``put`` says how
  many items it took), so the caller can hand it on itself.

``flush`` is called outside the lock, so ``put`` never waits for it. An exception in ``flush``
is logged and the thread goes on: a worker that died on one bad item would stop every later one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")

log = logging.getLogger(__name__)

# How long ``close`` waits for the thread to finish its last flush before flushing itself.
CLOSE_WAIT_SECONDS = 10.0


class BackgroundWorker(Generic[Item]):
    """A buffer of items drained by one daemon thread; see the module's docstring."""

    def __init__(
        self,
        name: str,
        flush: Callable[[list[Item]], None],
        interval_seconds: float,
        *,
        wait_for_work: bool = False,
        batch: int | None = None,
        capacity: int | None = None,
    ) -> None:
        self.name = name
        self.interval_seconds = interval_seconds
        self.wait_for_work = wait_for_work
        self.batch = batch
        self.capacity = capacity
        self._flush = flush
        self._items: list[Item] = []
        self._lock = threading.Condition()
        self._flushing = threading.Lock()  # one flush at a time: the thread's or a caller's
        self._closed = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start the thread now rather than at the first ``put`` (a steady tick from here)."""
        with self._lock:
            self._start_locked()

    def put(self, items: Sequence[Item]) -> int:
        """Take ``items`` for a later flush and start the thread if it is not running; how many
        were taken: all, those that fit under ``capacity``, or none once closed."""
        if not items:
            return 0
        with self._lock:
            if self._closed:
                return 0
            taken = len(items)
            if self.capacity is not None:
                taken = max(0, min(taken, self.capacity - len(self._items)))
            self._items.extend(items[:taken])
            self._start_locked()
            # Wakes the thread: to start the wait for company, or to hand a full batch on now.
            self._lock.notify()
        return taken

    def flush(self) -> None:
        """Hand everything put so far to ``flush`` now, from the calling thread."""
        with self._flushing:
            with self._lock:
                items, self._items = self._items, []
            if items:
                self._flush(items)

    def close(self, timeout: float = CLOSE_WAIT_SECONDS) -> None:
        """Stop the thread after its last flush, then flush what is left (at shutdown)."""
        with self._lock:
            self._closed = True
            thread = self._thread
            self._lock.notify_all()
        if thread is not None:
            thread.join(timeout=timeout)
        self.flush()

    def _start_locked(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                if self.wait_for_work:
                    while not self._items and not self._closed:
                        self._lock.wait()
                deadline = time.monotonic() + self.interval_seconds
                while not self._closed and not self._batch_full():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(left)
                closed = self._closed
                whole = None if closed or not self._batch_full() else self._whole_batches()
            try:
                if whole is None:
                    self.flush()
                else:
                    self._flush_first(whole)
            except Exception:  # the thread must outlive a bad item, or every later one waits
                log.exception("%s: flushing failed", self.name)
            if closed:
                return

    def _batch_full(self) -> bool:
        return self.batch is not None and len(self._items) >= self.batch

    def _whole_batches(self) -> int:
        assert self.batch is not None
        return len(self._items) - len(self._items) % self.batch

    def _flush_first(self, count: int) -> None:
        """Hand on the first ``count`` items (whole batches); the rest waits for more."""
        with self._flushing:
            with self._lock:
                items, self._items = self._items[:count], self._items[count:]
            if items:
                self._flush(items)
