"""The background thread that empties the outbox into the monitor's HTTP API.

Events go in gzip-compressed batches to ``POST /v1/events/batch``; feedback goes alone to
``POST /v1/events/{event_id}/feedback``, after every event recorded before it. A request the
monitor could not take (unreachable, 429, 502, 503, 504) is sent again, unchanged, until it can:
the event ids in it were fixed at ``record()``, so a resend whose first answer was lost is
answered "duplicate" and counted once. Meanwhile the outbox fills up to its capacity and the
application's threads carry on. What the monitor refuses for good is reported, never resent.

Every record taken off the outbox is settled exactly once, whatever it holds and whatever the
monitor answers: an event that cannot be serialised is rejected alone, an answer that cannot be
understood fails its batch, and anything unforeseen fails the records in hand rather than leaving
them pending for ever. The HTTP client (and its TLS context) is built here, on the sender thread,
when the first request goes out, never in the application's ``record()``.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import threading
from collections.abc import Callable

import httpx

from retrieval_monitor_client.answer import Answer, batch_outcomes, read_answer
from retrieval_monitor_client.config import SenderConfig
from retrieval_monitor_client.outbox import Outbox
from retrieval_monitor_client.wire import (
    EventRecord,
    FeedbackRecord,
    UnsendableError,
    batch_body,
    event_json,
    feedback_request,
    retry_after_seconds,
)

log = logging.getLogger("retrieval_monitor_client")

RejectionHandler = Callable[[str, str], None]
"""Called with (event_id, reason) for every event or feedback refused or given up on."""

# Answers that say "not now" rather than "not this": the same request is sent again.
_TRY_LATER = frozenset({429, 502, 503, 504})


class Sender:
    """Owns the HTTP connection and the thread; one per client per process."""

    def __init__(
        self, outbox: Outbox, config: SenderConfig, on_rejected: RejectionHandler | None
    ) -> None:
        # Nothing costly here: this runs in the application's first record().
        self._outbox = outbox
        self._config = config
        self._on_rejected = on_rejected
        self._http: httpx.Client | None = None
        self._abandon = threading.Event()
        self._stopping = False
        self._carry: tuple[EventRecord, bytes] | None = None
        self._in_hand: list[str] = []
        """Ids taken off the outbox and not yet settled, besides the carry."""
        self._unreachable = False
        self._thread = threading.Thread(
            target=self._run, name="retrieval-monitor-sender", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float) -> bool:
        """Stop after what is queued, or sooner once ``timeout`` has passed; True if it ended."""
        self._stopping = True
        self._outbox.wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            # Gives up the batch in hand at its next wait; the thread is a daemon either way.
            self._abandon.set()
            self._thread.join(min(timeout, 1.0) if timeout > 0 else 1.0)
        if self._thread.is_alive():
            return False
        if self._http is not None:
            self._http.close()
        return True

    # --- the loop -------------------------------------------------------------------------------

    def _run(self) -> None:
        outbox = self._outbox
        while True:
            outbox.wake.wait(self._config.flush_interval)
            outbox.wake.clear()
            try:
                while self._has_work():
                    if self._abandon.is_set():
                        self._give_up_all()
                        return
                    self._send_next()
            except Exception:  # the thread must outlive any surprise, or the queue would fill
                log.exception("retrieval-monitor client: unexpected error in the sender")
            if self._stopping and not self._has_work():
                return

    def _has_work(self) -> bool:
        return self._carry is not None or bool(self._outbox.items)

    def _send_next(self) -> None:
        try:
            head = self._outbox.items[0] if self._carry is None else self._carry[0]
            if isinstance(head, FeedbackRecord):
                self._outbox.items.popleft()
                self._in_hand = [head.event_id]
                self._send_feedback(head)
            else:
                batch = self._take_events()
                if batch:
                    self._send_events(batch)
        except Exception as exc:
            # Whatever was in hand is settled, so that flush() returns and the queue drains.
            log.exception("retrieval-monitor client: unexpected error while sending")
            in_hand, self._in_hand = self._in_hand, []
            self._settle_failed(in_hand, f"not sent: {exc.__class__.__name__} in the client")

    def _take_events(self) -> list[tuple[EventRecord, bytes]]:
        """The next events, up to batch_size and (past the first) max_batch_bytes."""
        batch: list[tuple[EventRecord, bytes]] = []
        size = 0
        items = self._outbox.items
        while len(batch) < self._config.batch_size:
            if self._carry is not None:
                event, body = self._carry
                self._carry = None
            else:
                if not items or isinstance(items[0], FeedbackRecord):
                    break
                event = items.popleft()  # type: ignore[assignment]
                try:
                    body = event_json(event)
                except UnsendableError as exc:
                    # Rejected alone: the events around it still go.
                    self._settle_rejected(event.event_id, str(exc))
                    continue
            if batch and size + len(body) > self._config.max_batch_bytes:
                self._carry = (event, body)
                break
            batch.append((event, body))
            self._in_hand.append(event.event_id)
            size += len(body)
        return batch

    # --- requests -------------------------------------------------------------------------------

    def _send_events(self, batch: list[tuple[EventRecord, bytes]]) -> None:
        body = gzip.compress(batch_body([b for _, b in batch]), self._config.compress_level)
        ids = [event.event_id for event, _ in batch]
        answer = self._post(
            "/v1/events/batch",
            body,
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        if answer is None:
            self._settle_failed(self._hand_over(), "still unsent when the client was closed")
            return
        outcomes = batch_outcomes(answer, len(ids))
        self._hand_over()
        if isinstance(outcomes, str):
            self._settle_failed(ids, outcomes)
            return
        accepted = duplicate = 0
        # Results come in request order, one per event.
        for event_id, (status, reason) in zip(ids, outcomes, strict=True):
            if status == "accepted":
                accepted += 1
            elif status == "duplicate":
                duplicate += 1
            else:
                self._settle_rejected(event_id, reason)
        self._outbox.settle(accepted=accepted, duplicate=duplicate)

    def _send_feedback(self, feedback: FeedbackRecord) -> None:
        try:
            url, body = feedback_request(feedback)
        except UnsendableError as exc:
            self._hand_over()
            self._settle_rejected(feedback.event_id, str(exc))
            return
        answer = self._post(url, body, {"Content-Type": "application/json"})
        self._hand_over()
        if answer is None:
            self._settle_failed([feedback.event_id], "still unsent when the client was closed")
        elif answer.is_success:
            self._outbox.settle(feedback_sent=1)
        elif 400 <= answer.status < 500:
            self._settle_rejected(feedback.event_id, answer.reason())
        else:
            self._settle_failed([feedback.event_id], answer.reason())

    def _hand_over(self) -> list[str]:
        """The ids in hand, which the caller now settles."""
        in_hand, self._in_hand = self._in_hand, []
        return in_hand

    def _connection(self) -> httpx.Client:
        if self._http is None:
            config = self._config
            headers = {"User-Agent": "retrieval-monitor-client"}
            if config.api_key:
                headers["Authorization"] = f"Bearer {config.api_key}"
            self._http = httpx.Client(
                base_url=config.base_url, timeout=config.timeout, headers=headers
            )
        return self._http

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> Answer | None:
        """POST until the monitor gives an answer that is not "later"; None once abandoned."""
        outage = 0
        server_errors = 0
        while not self._abandon.is_set():
            try:
                answer = self._exchange(url, body, headers)
            except httpx.TransportError as exc:
                self._note_unreachable(exc)
                wait = self._backoff(outage)
                outage += 1
            else:
                self._note_reachable()
                status = answer.status
                if status in _TRY_LATER:
                    hinted = retry_after_seconds(answer.retry_after, self._config.max_retry_wait)
                    wait = self._backoff(outage) if hinted is None else hinted
                    outage += 1
                elif status >= 500 and server_errors + 1 < self._config.server_error_attempts:
                    server_errors += 1
                    wait = self._backoff(server_errors)
                else:
                    return answer
            self._outbox.retries += 1
            self._abandon.wait(wait)
        return None

    def _exchange(self, url: str, body: bytes, headers: dict[str, str]) -> Answer:
        """One request and its answer, the body read within the size and time bounds."""
        config = self._config
        with self._connection().stream("POST", url, content=body, headers=headers) as response:
            if response.status_code in _TRY_LATER:
                # Only the header matters; the body of a "later" is not worth reading.
                return Answer(response.status_code, response.headers.get("Retry-After"), b"", True)
            return read_answer(response, config.max_answer_bytes, config.timeout)

    def _backoff(self, attempt: int) -> float:
        return float(min(0.1 * 2.0**attempt, self._config.max_backoff))

    def _note_unreachable(self, exc: Exception) -> None:
        if not self._unreachable:
            self._unreachable = True
            log.warning(
                "retrieval-monitor at %s cannot be reached (%s); holding events and retrying",
                self._config.base_url,
                exc.__class__.__name__,
            )

    def _note_reachable(self) -> None:
        if self._unreachable:
            self._unreachable = False
            log.warning("retrieval-monitor at %s answers again", self._config.base_url)

    # --- outcomes -------------------------------------------------------------------------------

    def _settle_rejected(self, event_id: str, reason: str) -> None:
        self._outbox.settle(rejected=1)
        self._report(event_id, reason)

    def _settle_failed(self, event_ids: list[str], reason: str) -> None:
        self._outbox.settle(failed=len(event_ids))
        for event_id in event_ids:
            self._report(event_id, reason)

    def _give_up_all(self) -> None:
        ids = [] if self._carry is None else [self._carry[0].event_id]
        self._carry = None
        while self._outbox.items:
            ids.append(self._outbox.items.popleft().event_id)
        self._settle_failed(ids, "still unsent when the client was closed")

    def _report(self, event_id: str, reason: str) -> None:
        if self._on_rejected is None:
            return
        # A failing handler must not stop the sender.
        with contextlib.suppress(Exception):
            self._on_rejected(event_id, reason)
