"""The application's side: ``record()`` and ``feedback()`` queue and return; the sender sends.

The caller pays for building one small object and one uncontended lock; the JSON, the
compression and the network happen on the sender thread. A client is safe to share between
threads, is closed (flushed within ``close_timeout``) at interpreter exit, and survives
``fork()``: a pre-forking server's workers each start a sender of their own on first use, with
their own event-id prefix, and leave the parent's queue to the parent.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import itertools
import logging
import os
import secrets
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

from retrieval_monitor_client.config import (
    SenderConfig,
    checked_api_key,
    checked_count,
    checked_label,
    checked_seconds,
    checked_url,
)
from retrieval_monitor_client.outbox import Outbox, Stats
from retrieval_monitor_client.sender import RejectionHandler, Sender
from retrieval_monitor_client.wire import EventRecord, FeedbackRecord

log = logging.getLogger("retrieval_monitor_client")

Passage = str | Mapping[str, Any]
"""A passage's text, or a mapping with ``text`` and optionally ``id`` and ``score``."""


class _Recorder:
    """What the blocking and the asyncio clients share: everything but how to wait."""

    def __init__(
        self,
        url: str,
        *,
        app: str,
        retriever: str,
        environment: str | None = None,
        api_key: str | None = None,
        max_pending: int = 10_000,
        batch_size: int = 100,
        max_batch_bytes: int = 1_000_000,
        flush_interval: float = 1.0,
        timeout: float = 10.0,
        max_retry_wait: float = 30.0,
        max_backoff: float = 5.0,
        server_error_attempts: int = 3,
        send_timestamps: bool = True,
        on_rejected: RejectionHandler | None = None,
        close_timeout: float = 5.0,
    ) -> None:
        """Events go to the monitor at ``url``, labelled ``app`` and ``retriever`` by default.

        At most ``max_pending`` events and feedback are held (queued or being sent); past that
        they are dropped and counted. A batch leaves once it holds ``batch_size`` events or
        ``max_batch_bytes`` of JSON, or ``flush_interval`` seconds after the last one left.
        ``on_rejected(event_id, reason)`` runs on the sender thread for anything refused or
        given up on. ``send_timestamps=False`` lets the monitor stamp arrival instead of the
        time of ``record()`` (a replay that must send identical events each run wants that).
        """
        # Mistakes in the configuration are raised here, where the application sees them, rather
        # than failing every request later on the sender thread.
        max_pending = checked_count("max_pending", max_pending)
        batch_size = checked_count("batch_size", batch_size)
        if batch_size > max_pending:
            raise ValueError(f"batch_size ({batch_size}) exceeds max_pending ({max_pending})")
        self._max_pending = max_pending
        self._app = checked_label("app", app)
        self._retriever = checked_label("retriever", retriever)
        self._environment = (
            None if environment is None else checked_label("environment", environment)
        )
        self._send_timestamps = bool(send_timestamps)
        if on_rejected is not None and not callable(on_rejected):
            raise ValueError("on_rejected must be callable")
        self._on_rejected = on_rejected
        self._close_timeout = checked_seconds("close_timeout", close_timeout, zero_allowed=True)
        self._config = SenderConfig(
            base_url=checked_url(url),
            api_key=checked_api_key(api_key),
            batch_size=batch_size,
            max_batch_bytes=checked_count("max_batch_bytes", max_batch_bytes),
            flush_interval=checked_seconds("flush_interval", flush_interval, zero_allowed=False),
            timeout=checked_seconds("timeout", timeout, zero_allowed=False),
            max_retry_wait=checked_seconds("max_retry_wait", max_retry_wait, zero_allowed=True),
            max_backoff=checked_seconds("max_backoff", max_backoff, zero_allowed=True),
            server_error_attempts=checked_count("server_error_attempts", server_error_attempts),
            compress_level=5,
            # Room for one result per event however long its error, and never less than 1 MiB.
            max_answer_bytes=max(1 << 20, batch_size * 2048),
        )
        self._closed = False
        self._fresh_process_state()
        _LIVE.add(self)

    def _fresh_process_state(self) -> None:
        """What belongs to one process: the queue, the sender, the id sequence."""
        self._outbox = Outbox(self._max_pending, self._config.batch_size)
        self._sender: Sender | None = None
        self._start_lock = threading.Lock()
        # A random prefix per process and client: ids stay unique across forked workers.
        self._id_prefix = secrets.token_hex(8) + "-"
        self._ids = itertools.count(1)

    # --- the application's calls ----------------------------------------------------------------

    def record(
        self,
        query: str,
        passages: Sequence[Passage],
        *,
        k: int | None = None,
        app: str | None = None,
        retriever: str | None = None,
        environment: str | None = None,
        gold_passage_ids: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        response: str | None = None,
        event_id: str | None = None,
        timestamp: datetime | float | None = None,
    ) -> str:
        """Queue one retrieval and return its event id at once, whatever the monitor's state.

        ``passages`` are ranked, the prompt carries the first ``k`` (default: all). The objects
        are read later, on the sender thread: do not change them after the call. If the queue
        is full the event is dropped and counted in ``stats().dropped``; the id is returned
        all the same. Never raises and never waits: whatever the arguments hold, the event is
        counted, and one that cannot be sent is rejected on the sender thread.
        """
        # Only identity tests on the caller's objects here: their own code (a __bool__, a
        # __len__) runs on the sender thread, where what it raises rejects this event alone.
        if event_id is None:
            event_id = self._id_prefix + format(next(self._ids), "x")
        if timestamp is None and self._send_timestamps:
            timestamp = time.time()
        self._put(
            EventRecord(
                event_id,
                timestamp,
                self._app if app is None else app,
                self._retriever if retriever is None else retriever,
                self._environment if environment is None else environment,
                query,
                passages,
                k,
                gold_passage_ids,
                metadata,
                response,
            )
        )
        return event_id

    def feedback(
        self,
        event_id: str,
        *,
        response_grade: int | None = None,
        answer_correct: bool | None = None,
        response: str | None = None,
    ) -> None:
        """Queue the answer's grade (1-5) and/or correctness for a recorded event."""
        body: dict[str, Any] = {
            name: value
            for name, value in (
                ("response_grade", response_grade),
                ("answer_correct", answer_correct),
                ("response", response),
            )
            if value is not None
        }
        if not body:
            raise ValueError("give response_grade, answer_correct or response")
        self._put(FeedbackRecord(event_id, body))

    def stats(self) -> Stats:
        """What became of everything recorded so far in this process."""
        return self._outbox.stats()

    # --- internals ------------------------------------------------------------------------------

    def _put(self, item: EventRecord | FeedbackRecord) -> None:
        if self._closed:
            self._outbox.refuse(item)
            return
        if self._sender is None:
            self._start_sender()
        self._outbox.put(item)

    def _start_sender(self) -> None:
        with self._start_lock:
            if self._sender is None and not self._closed:
                sender = Sender(self._outbox, self._config, self._on_rejected)
                try:
                    sender.start()
                except RuntimeError:  # no thread to be had: the next call tries again
                    log.exception("retrieval-monitor client: cannot start the sender thread")
                    return
                self._sender = sender

    def _flush(self, timeout: float | None) -> bool:
        mark = self._outbox.mark()
        self._outbox.wake.set()
        return self._outbox.wait_settled(mark, timeout)

    def _close(self, timeout: float | None) -> Stats:
        if timeout is None:
            timeout = self._close_timeout
        started = time.monotonic()
        self._closed = True
        _LIVE.discard(self)
        sender = self._sender
        if sender is not None:
            self._flush(timeout)
            sender.stop(max(timeout - (time.monotonic() - started), 0.0))
        else:
            # Never sent: what was queued while no sender could start is given up, not left
            # pending for ever.
            unsent = self._outbox.take_all()
            self._outbox.settle(failed=len(unsent))
            for item in unsent:
                if self._on_rejected is not None:
                    with contextlib.suppress(Exception):
                        self._on_rejected(item.event_id, "no sender thread could be started")
        return self.stats()

    def _after_fork_in_child(self) -> None:
        # The parent's sender thread does not exist here and its queue is the parent's to send.
        self._fresh_process_state()


class MonitorClient(_Recorder):
    """Sends retrieval events to retrieval-monitor from a background thread.

    >>> monitor = MonitorClient("http://127.0.0.1:8080", app="shop", retriever="bm25")
    >>> event_id = monitor.record("red shoes", [{"id": "d1", "text": "Red shoes, size 42"}])
    """

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything recorded before the call is sent (or refused); False on timeout."""
        return self._flush(timeout)

    def close(self, timeout: float | None = None) -> Stats:
        """Flush for up to ``timeout`` seconds (default ``close_timeout``), then stop the sender.

        What is still unsent then counts as failed. Later calls to ``record()`` are dropped.
        """
        return self._close(timeout)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AsyncMonitorClient(_Recorder):
    """The same client for asyncio applications: ``record()`` and ``feedback()`` never wait, so
    they are safe to call on the event loop; ``flush()`` and ``aclose()`` are awaited and wait in
    a worker thread, leaving the loop free."""

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait until everything recorded before the call is sent (or refused); False on timeout."""
        return await asyncio.to_thread(self._flush, timeout)

    async def aclose(self, timeout: float | None = None) -> Stats:
        """Flush for up to ``timeout`` seconds (default ``close_timeout``), then stop the sender."""
        return await asyncio.to_thread(self._close, timeout)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


_LIVE: weakref.WeakSet[_Recorder] = weakref.WeakSet()


def _close_all_at_exit() -> None:
    for client in list(_LIVE):
        client._close(None)


def _reset_in_child() -> None:
    for client in list(_LIVE):
        client._after_fork_in_child()


atexit.register(_close_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
