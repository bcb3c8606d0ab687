"""The near-duplicate ratio of accepted events, counted after the answer rather than before it.

The ratio feeds one histogram and decides nothing: whether an event goes to the urgent queue is
decided at ingest by ``NearDuplicateCount.reaches``, which stops as soon as the answer is known.
The count is finished here (``NearDuplicateCount.total``, from where ingest stopped), on a
thread of the API process, for every accepted event, and added to the shared aggregates in one
Redis call per flush: every
``FLUSH_SECONDS``, before each ``/metrics`` scrape, and at shutdown. A crash loses at most that
long of this histogram (the events themselves are committed; the histogram is not rebuilt from
the database, as before).

The backlog is bounded: an API that receives more events than this thread can count keeps
storing them and skips their ratio (logged with the number skipped), rather than slowing
ingest down or holding their text without limit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from service.ingest.signals import NearDuplicateCount
from service.primitives.background import BackgroundWorker
from service.telemetry.aggregates import Aggregates, Delta

log = logging.getLogger(__name__)

FLUSH_SECONDS = 0.25
# Events waiting to be counted: ~4 s of a saturated process, ~10 KB of text each at most.
CAPACITY = 5_000
# How often a skipping backlog is logged.
_LOG_EVERY_SECONDS = 60.0


@dataclass(frozen=True)
class PendingRatio:
    tenant: str
    labels: tuple[str, str, str]  # app, retriever, environment
    duplicates: NearDuplicateCount  # of the compared passages, as far as ingest read it
    passages: int  # in the top k


class DuplicateRatios:
    """Counts near-duplicates of accepted events on a thread and exports their ratio."""

    def __init__(
        self,
        aggregates: Aggregates,
        flush_seconds: float = FLUSH_SECONDS,
        capacity: int = CAPACITY,
    ) -> None:
        self.aggregates = aggregates
        self.flush_seconds = flush_seconds
        self.capacity = capacity
        self._worker: BackgroundWorker[PendingRatio] = BackgroundWorker(
            "duplicate-ratios", self._export, flush_seconds, capacity=capacity
        )
        self._skipped_lock = threading.Lock()
        self._skipped = 0
        self._skip_logged = 0.0

    def submit(self, items: Sequence[PendingRatio]) -> None:
        """Queue the events of one ingest call; never blocks on the counting."""
        if not items:
            return
        skipped = len(items) - self._worker.put(items)
        if skipped:
            with self._skipped_lock:
                self._skipped += skipped
        self._log_skipped()

    def flush(self) -> None:
        """Count and export everything queued so far (a scrape calls this before reading)."""
        self._worker.flush()

    def close(self) -> None:
        """Stop the thread and export what is left (at shutdown)."""
        self._worker.close()

    def _export(self, pending: list[PendingRatio]) -> None:
        delta = Delta()
        ratios: dict[tuple[str, str, str, str], list[float]] = {}
        for item in pending:
            if not item.passages:
                continue
            duplicates = item.duplicates.total()
            ratios.setdefault((item.tenant, *item.labels), []).append(duplicates / item.passages)
        for (tenant, app, retriever, environment), observed in ratios.items():
            labels = {
                "tenant": tenant,
                "app": app,
                "retriever": retriever,
                "environment": environment,
            }
            delta.observe_many("signal_duplicate_ratio", labels, observed)
        try:
            self.aggregates.add(delta)
        except Exception:  # a histogram only; the events are committed
            log.warning("could not export duplicate ratios", exc_info=True)

    def _log_skipped(self) -> None:
        now = time.monotonic()
        if not self._skipped or now - self._skip_logged < _LOG_EVERY_SECONDS:
            return
        with self._skipped_lock:
            skipped, self._skipped = self._skipped, 0
        self._skip_logged = now
        log.warning(
            "%d accepted events were not counted in the duplicate-ratio histogram: more than "
            "%d waited to be counted",
            skipped,
            self.capacity,
        )
