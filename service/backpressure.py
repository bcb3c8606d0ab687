"""Refusing work before it hurts: when the backlog of unjudged events or the database's commit
latency passes a bound, ingest answers 503 with Retry-After instead of queueing without limit."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from service import repository
from service.db import session_scope
from service.runtime import Runtime

# How much one slow commit moves the average: high enough to react within a few requests.
_EWMA_WEIGHT = 0.2


@dataclass(frozen=True)
class Overload:
    reason: str  # a bounded metric label: backlog, slow_database
    message: str
    retry_after_seconds: int


class Backpressure:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._lock = threading.Lock()
        self._pending = 0
        self._pending_checked = 0.0
        self._commit_seconds = 0.0

    def record_commit(self, seconds: float) -> None:
        with self._lock:
            self._commit_seconds += _EWMA_WEIGHT * (seconds - self._commit_seconds)

    def pending_events(self) -> int:
        # One COUNT per refresh interval for the whole process, not one per request.
        now = time.monotonic()
        refresh = self.runtime.settings.backpressure_refresh_seconds
        if now - self._pending_checked >= refresh and self._lock.acquire(blocking=False):
            try:
                with session_scope(self.runtime.engine) as session:
                    self._pending = repository.pending_summary(session).count
                self._pending_checked = now
            finally:
                self._lock.release()
        return self._pending

    def check(self) -> Overload | None:
        settings = self.runtime.settings
        if settings.max_pending_events and self.pending_events() >= settings.max_pending_events:
            return Overload(
                "backlog",
                f"{self._pending} events wait for judging (max_pending_events "
                f"{settings.max_pending_events}); retry later",
                settings.backpressure_retry_after_seconds,
            )
        if self._commit_seconds > settings.max_commit_seconds:
            return Overload(
                "slow_database",
                f"database commits take {self._commit_seconds:.2f}s on average "
                f"(max_commit_seconds {settings.max_commit_seconds}); retry later",
                settings.backpressure_retry_after_seconds,
            )
        return None
