"""Group commit for single-event ingest: concurrent requests share one transaction.

Each ``POST /v1/events`` request checks its event, hands it to the process's writer and awaits
its outcome on the event loop (no thread of the pool is held while the commit runs).
The writer takes everything queued (up to ``max_group``) and stores it through the batch path, so
a group costs one transaction, one counter update and one fan-out message per tenant in it, then
gives each request its own outcome (PostgreSQL gets a second writer; see ``AppState.build``).
A request is answered only after the commit that holds its event, or with an error: the
acceptance guarantee of the single-event path is unchanged.

There is no batching delay: the writer takes what is queued when it becomes free, so a quiet
service commits each event at once, and groups grow only while requests arrive faster than
commits complete.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from kombu.exceptions import OperationalError as BrokerError
from redis import RedisError
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from service.contract.schemas import EventIn, IngestResult

log = logging.getLogger(__name__)

# Stores one tenant's events in one transaction; results in the order given (Ingestor.ingest).
Store = Callable[[str, Sequence[EventIn]], list[IngestResult]]

# Failures of a dependency rather than of one event: retrying the group's events one by one
# would fail the same way, so every request of the group gets the error at once.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    PoolTimeout,
    RedisError,
    BrokerError,
    OSError,
)

# Longer than SQLite's busy timeout (30 s, service/store/engine.py), so a request outlasts the
# writer's longest honest wait for the database and gets the real outcome; still a bound if it
# hangs.
WAIT_SECONDS = 60.0


class NotStoredError(Exception):
    """The event was not (or not surely) stored: 503 with Retry-After. (A value the database
    refuses is not this: the event's own result says "rejected", see Ingestor.ingest.)"""

    def __init__(self, reason: str, message: str, status_code: int = 503) -> None:
        super().__init__(message)
        # A bounded metric label: queue_full, stopping, store_failed, unconfirmed.
        self.reason = reason
        self.status_code = status_code


@dataclass
class _Pending:
    tenant: str
    event: EventIn
    future: Future[IngestResult] = field(default_factory=Future)


class GroupCommitter:
    """Writer threads (usually one) per API process, fed by a bounded queue."""

    def __init__(self, store: Store, max_group: int, capacity: int, writers: int = 1) -> None:
        self._store = store
        self.max_group = max_group
        self.capacity = capacity
        self.writers = writers
        self._queue: deque[_Pending] = deque()
        self._ready = threading.Condition()
        self._closing = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        with self._ready:
            if self._threads or self._closing:
                return
            for number in range(self.writers):
                thread = threading.Thread(
                    target=self._run, name=f"group-commit-{number}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def submit(self, tenant: str, event: EventIn) -> Future[IngestResult]:
        """Queue one event; its future resolves after the commit that holds it."""
        pending = _Pending(tenant, event)
        with self._ready:
            if self._closing:
                raise NotStoredError("stopping", "the service is shutting down; retry later")
            if len(self._queue) >= self.capacity:
                # Bounded memory under saturation: refuse rather than queue without limit.
                raise NotStoredError(
                    "queue_full",
                    f"{len(self._queue)} events already wait to be stored; retry later",
                )
            self._queue.append(pending)
            self._ready.notify()
        return pending.future

    async def store(
        self, tenant: str, event: EventIn, timeout: float = WAIT_SECONDS
    ) -> IngestResult:
        """Queue one event and await its own outcome (accepted, duplicate or rejected).

        The writer resolves a concurrent future; ``wrap_future`` hands its outcome to this
        coroutine's loop (``call_soon_threadsafe``), so the wait costs no thread. ``shield``: a
        waiter that gives up (the timeout, or its request's task cancelled) must not cancel the
        writer's future: the event may be in the transaction being committed, and the writer's
        ``set_result`` on a future cancelled meanwhile would raise and fail the rest of its group.
        """
        future = self.submit(tenant, event)
        try:
            async with asyncio.timeout(timeout):
                return await asyncio.shield(asyncio.wrap_future(future))
        except TimeoutError:
            raise NotStoredError(
                "unconfirmed",
                f"the event's commit was not confirmed within {timeout:g}s; it may still be "
                "stored: retry with the same event_id",
            ) from None

    def close(self, timeout: float = WAIT_SECONDS) -> None:
        """Stop taking events and drain the queue: each is committed or failed, none dropped."""
        with self._ready:
            self._closing = True
            self._ready.notify_all()
            threads = list(self._threads)
        if not threads:
            self._run()  # never started: drain here
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._ready:
            left = list(self._queue)
            self._queue.clear()
        for pending in left:  # a writer is stuck on the database past the bound
            _fail(
                pending, NotStoredError("stopping", "the service stopped before storing the event")
            )

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._queue and not self._closing:
                    self._ready.wait()
                if not self._queue:
                    return
                count = min(len(self._queue), self.max_group)
                group = [self._queue.popleft() for _ in range(count)]
            try:
                self._commit(group)
            except BaseException as exc:  # the writer must outlive any failure, or requests hang
                log.exception("group commit failed unexpectedly")
                for pending in group:
                    _fail(
                        pending,
                        NotStoredError(
                            "store_failed", f"the event was not stored ({type(exc).__name__})"
                        ),
                    )

    def _commit(self, group: list[_Pending]) -> None:
        by_tenant: dict[str, list[_Pending]] = {}
        for pending in group:
            by_tenant.setdefault(pending.tenant, []).append(pending)
        for tenant, items in by_tenant.items():
            self._commit_tenant(tenant, items)

    def _commit_tenant(self, tenant: str, items: list[_Pending]) -> None:
        try:
            results = self._store(tenant, [pending.event for pending in items])
        except Exception as exc:
            if len(items) > 1 and not isinstance(exc, _UNAVAILABLE):
                # Probably one event's own fault: store each alone so only its request fails.
                # The type only: the message of a statement error quotes event text.
                log.warning(
                    "storing a group of %d events failed (%s); storing them one by one",
                    len(items),
                    type(exc).__name__,
                )
                for pending in items:
                    self._commit_tenant(tenant, [pending])
                return
            log.error("could not store %d event(s)", len(items), exc_info=exc)
            cause = (
                "the database or the broker is unavailable"
                if isinstance(exc, _UNAVAILABLE)
                else f"storing it failed ({type(exc).__name__})"
            )
            for pending in items:  # an exception each: each is raised in its own thread
                _fail(pending, NotStoredError("store_failed", f"the event was not stored: {cause}"))
            return
        for pending, result in zip(items, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)


def _fail(pending: _Pending, error: NotStoredError) -> None:
    if not pending.future.done():
        pending.future.set_exception(error)
