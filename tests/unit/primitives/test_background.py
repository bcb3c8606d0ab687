"""The background worker: when what is put is handed on (a tick, a full batch, a wait for
company, an explicit flush, the close), what it refuses, and that a failing flush stops nothing."""

from __future__ import annotations

import threading
import time

from service.primitives.background import BackgroundWorker
from tests.support.live import wait_for


class Flushes:
    """Records every flush (its items, in order) from whichever thread made it."""

    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[list[int]] = []
        self.threads: list[str] = []
        self.attempts = 0
        self._fail_first = fail_first
        self._lock = threading.Lock()

    def __call__(self, items: list[int]) -> None:
        with self._lock:
            self.attempts += 1
            if self._fail_first:
                self._fail_first = False
                raise RuntimeError("a bad item")
            self.calls.append(items)
            self.threads.append(threading.current_thread().name)

    @property
    def items(self) -> list[int]:
        with self._lock:
            return [item for call in self.calls for item in call]


def test_a_steady_tick_hands_on_what_was_put_from_the_workers_thread() -> None:
    flushes = Flushes()
    worker = BackgroundWorker("tick", flushes, 0.05)
    try:
        worker.start()
        assert worker.put([1, 2]) == 2
        wait_for(lambda: flushes.items == [1, 2], timeout=10, interval=0.01)
        assert flushes.threads == ["tick"]
        worker.put([3])
        wait_for(lambda: flushes.items == [1, 2, 3], timeout=10, interval=0.01)
    finally:
        worker.close()


def test_nothing_put_means_no_flush_and_no_thread() -> None:
    flushes = Flushes()
    worker = BackgroundWorker("idle", flushes, 0.01)
    assert worker.put([]) == 0
    time.sleep(0.05)
    worker.close()
    assert flushes.calls == []
    assert "idle" not in {thread.name for thread in threading.enumerate()}


def test_an_explicit_flush_hands_on_at_once_in_the_callers_thread() -> None:
    flushes = Flushes()
    worker = BackgroundWorker("slow", flushes, 3600)
    try:
        worker.put([1, 2, 3])
        assert flushes.calls == []
        worker.flush()
        assert flushes.calls == [[1, 2, 3]]
        assert flushes.threads == [threading.current_thread().name]
        worker.flush()  # nothing left: no empty flush
        assert flushes.calls == [[1, 2, 3]]
    finally:
        worker.close()


def test_close_hands_on_what_waits_and_refuses_what_comes_after() -> None:
    flushes = Flushes()
    worker = BackgroundWorker("closing", flushes, 3600)
    worker.put([1, 2])
    worker.close()
    assert flushes.items == [1, 2]
    assert worker.put([3]) == 0  # the caller hands it on itself
    worker.flush()
    assert flushes.items == [1, 2]


def test_capacity_takes_what_fits_and_says_how_much() -> None:
    flushes = Flushes()
    worker = BackgroundWorker("bounded", flushes, 3600, capacity=3)
    assert worker.put([1, 2]) == 2
    assert worker.put([3, 4, 5]) == 1
    assert worker.put([6]) == 0
    worker.close()
    assert flushes.items == [1, 2, 3]


def test_gathering_waits_for_company_then_hands_on_everything() -> None:
    flushes = Flushes()
    worker = BackgroundWorker("gather", flushes, 0.2, wait_for_work=True, batch=16)
    try:
        started = time.monotonic()
        for item in (1, 2, 3):
            worker.put([item])
        wait_for(lambda: flushes.calls, timeout=10, interval=0.01)
        assert time.monotonic() - started >= 0.15  # the wait for company
        assert flushes.calls == [[1, 2, 3]]
        worker.put([4])  # a wait of its own
        wait_for(lambda: len(flushes.calls) == 2, timeout=10, interval=0.01)
        assert flushes.calls[-1] == [4]
    finally:
        worker.close()


def test_a_full_batch_goes_at_once_and_the_rest_waits_until_close() -> None:
    flushes = Flushes()
    worker = BackgroundWorker("batches", flushes, 3600, wait_for_work=True, batch=4)
    for item in range(1, 6):
        worker.put([item])
    wait_for(lambda: flushes.calls, timeout=10, interval=0.01)
    assert flushes.calls == [[1, 2, 3, 4]]
    time.sleep(0.05)
    assert flushes.calls == [[1, 2, 3, 4]]  # the fifth waits for company
    worker.close()
    assert flushes.calls == [[1, 2, 3, 4], [5]]


def test_a_failing_flush_is_logged_and_the_thread_goes_on() -> None:
    flushes = Flushes(fail_first=True)
    worker = BackgroundWorker("sturdy", flushes, 0.02)
    try:
        worker.put([1])
        # The first flush raised: its items are gone, the thread is not.
        wait_for(lambda: flushes.attempts == 1, timeout=10, interval=0.01)
        worker.put([2])
        wait_for(lambda: flushes.items == [2], timeout=10, interval=0.01)
    finally:
        worker.close()
