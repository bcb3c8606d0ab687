"""Refusing work before it hurts: when the backlog of unjudged events or the database's commit
latency passes a bound, ingest answers 503 with Retry-After instead of queueing without limit."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from service.store import events as event_store
from service.store.engine import session_scope
from service.wiring.runtime import Runtime

# How much one slow commit moves the average: high enough to react within a few requests.
_EWMA_WEIGHT = 0.2
# Without new commits the average fades (e-fold time): while it is over the bound every request
# is refused, so no commit comes to bring it down; fading lets a probe through once the database
# had this long to catch up.
_FADE_SECONDS = 5.0


@dataclass(frozen=True)
class Overload:
    reason: str  # a bounded metric label: backlog, slow_database
    message: str
    retry_after_seconds: int


class Backpressure:
    def __init__(self, runtime: Runtime, clock: Callable[[], float] = time.monotonic) -> None:
        self.runtime = runtime
        self.clock = clock
        self._lock = threading.Lock()
        self._pending = 0
        self._pending_checked = 0.0
        self._commit_seconds = 0.0
        self._commit_at = clock()

    def commit_seconds(self) -> float:
        """The recent average commit time, faded by the time since the last commit."""
        idle = max(self.clock() - self._commit_at, 0.0)
        return self._commit_seconds * math.exp(-idle / _FADE_SECONDS)

    def record_commit(self, seconds: float) -> None:
        with self._lock:
            average = self.commit_seconds()
            self._commit_seconds = average + _EWMA_WEIGHT * (seconds - average)
            self._commit_at = self.clock()

    def pending_events(self, refresh: bool = True) -> int:
        # One COUNT per refresh interval for the whole process, not one per request.
        now = time.monotonic()
        if refresh and self._count_is_stale(now) and self._lock.acquire(blocking=False):
            try:
                with session_scope(self.runtime.engine) as session:
                    self._pending = event_store.pending_summary(session).count
                self._pending_checked = now
            finally:
                self._lock.release()
        return self._pending

    def decides_without_io(self) -> bool:
        """Whether ``check`` can answer now without a query: the backlog bound is off or its
        count was read within the refresh interval. The event loop asks this before deciding in
        place; otherwise the check, and its COUNT, goes to the thread pool."""
        return not self.runtime.settings.max_pending_events or not self._count_is_stale(
            time.monotonic()
        )

    def _count_is_stale(self, now: float) -> bool:
        refresh = self.runtime.settings.backpressure_refresh_seconds
        return now - self._pending_checked >= refresh

    def check(self, refresh: bool = True) -> Overload | None:
        """Why the service should refuse work now, or None. ``refresh=False`` decides on the
        cached backlog count, never querying (the event loop's path, after
        ``decides_without_io``: a count that went stale in between is at most a moment old)."""
        settings = self.runtime.settings
        if (
            settings.max_pending_events
            and self.pending_events(refresh) >= settings.max_pending_events
        ):
            return Overload(
                "backlog",
                f"{self._pending} events wait for judging (max_pending_events "
                f"{settings.max_pending_events}); retry later",
                settings.backpressure_retry_after_seconds,
            )
        commit_seconds = self.commit_seconds()
        if commit_seconds > settings.max_commit_seconds:
            return Overload(
                "slow_database",
                f"database commits take {commit_seconds:.2f}s on average "
                f"(max_commit_seconds {settings.max_commit_seconds}); retry later",
                settings.backpressure_retry_after_seconds,
            )
        return None
