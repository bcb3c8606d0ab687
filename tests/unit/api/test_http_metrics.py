"""HTTP answers are counted per (route, status class): every answer exactly once, whatever
threads record while flushes run, and between two flushes the process holds one entry per pair."""

from __future__ import annotations

import threading
import tracemalloc
from collections import Counter
from typing import cast

from service.api.http_metrics import HttpResponseCounter
from service.telemetry.aggregates import Aggregates, Delta


class Exported:
    """Stands for the shared aggregates: adds up every delta it is given."""

    def __init__(self) -> None:
        self.total: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, delta: Delta) -> None:
        with self._lock:
            for field_name, amount in delta.values.items():
                self.total[field_name] += int(amount)


def test_every_answer_is_exported_once_while_threads_record_and_flushes_run() -> None:
    exported = Exported()
    counter = HttpResponseCounter(cast(Aggregates, exported))
    routes = [("/v1/events", 202), ("/v1/events/batch", 200), ("/metrics", 503)]
    per_thread = 2_000

    def answer() -> None:
        for i in range(per_thread):
            route, status = routes[i % len(routes)]
            counter.record(route, status)
            if i % 500 == 0:
                counter.flush()

    threads = [threading.Thread(target=answer) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    counter.stop()
    assert sum(exported.total.values()) == 6 * per_thread
    assert len(exported.total) == len(routes)


def test_between_flushes_memory_does_not_grow_with_the_answers() -> None:
    exported = Exported()
    counter = HttpResponseCounter(cast(Aggregates, exported))
    counter.record("/v1/events", 202)  # the flusher's thread and the pair exist from here on
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(20_000):
            counter.record("/v1/events", 202)
            counter.record("/v1/events", 429)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # One list slot per answer alone would be 320 kB; a pair's entry is a few hundred bytes.
    assert held < 16_384, held
    counter.stop()
    assert sorted(exported.total.values()) == [20_000, 20_001]
