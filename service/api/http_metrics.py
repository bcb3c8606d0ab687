"""Counting HTTP answers by route and status class, for the ingest-errors alert.

Counts are kept in the process and flushed to the shared aggregates once a second by a background
thread, so a request pays no Redis round trip for them; a crash loses at most a second of counts.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.primitives.background import BackgroundWorker
from service.telemetry.aggregates import Aggregates, Delta

log = logging.getLogger(__name__)
FLUSH_SECONDS = 1.0


class HttpResponseCounter:
    def __init__(self, aggregates: Aggregates) -> None:
        self.aggregates = aggregates
        # Counts per (route template, status class): between two flushes the process holds one
        # entry per pair answered, however many requests there were.
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self._worker: BackgroundWorker[tuple[str, str]] = BackgroundWorker(
            "http-metrics", self._export, FLUSH_SECONDS
        )

    def record(self, route: str, status: int) -> None:
        answer = (route, f"{status // 100}xx")
        with self._lock:
            first = answer not in self._counts
            self._counts[answer] += 1
        if first:
            # The worker is handed a pair once per flush: the flush that takes it exports every
            # count held by then.
            self._worker.put([answer])

    def flush(self) -> None:
        self._worker.flush()

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.close(timeout=5)

    def _export(self, _answered: list[tuple[str, str]]) -> None:
        with self._lock:
            counts, self._counts = self._counts, Counter()
        if not counts:
            return
        delta = Delta()
        for (route, status_class), count in counts.items():
            delta.inc("http_responses", {"route": route, "status_class": status_class}, count)
        try:
            self.aggregates.add(delta)
        except Exception:
            log.warning("could not export HTTP response counts", exc_info=True)


class HttpMetricsMiddleware:
    def __init__(self, app: ASGIApp, counter: HttpResponseCounter) -> None:
        self.app = app
        self.counter = counter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope.get("route")
            # The route template, never the raw path: ids must not become label values.
            template = getattr(route, "path", None) or _prefix_of(scope.get("path", ""))
            self.counter.record(template, status)


def _prefix_of(path: str) -> str:
    # Requests answered before routing (body too large, bad encoding) keep a bounded label.
    for prefix in ("/v1/events/batch", "/v1/events", "/v1/traces"):
        if path.startswith(prefix):
            return prefix
    return "other"
