"""The background thread that empties the outbox into the monitor's HTTP API.

Events go in gzip-compressed batches to ``POST /v1/events/batch``; feedback goes alone to
``POST /v1/events/{event_id}/feedback``, after every event recorded before it. A request the
monitor could not take (unreachable, 429, 502, 503, 504) is sent again, unchanged, until it can:
the event ids in it were fixed at ``record()``, so a resend whose first answer was lost is
answered "duplicate" and counted once. Meanwhile the outbox fills up to its capacity and the
application's threads carry on. What the monitor refuses for good is reported, never resent.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx

from retrieval_monitor_client.outbox import Outbox
from retrieval_monitor_client.wire import (
    EventRecord,
    FeedbackRecord,
    UnsendableError,
    batch_body,
    event_json,
    retry_after_seconds,
)

log = logging.getLogger("retrieval_monitor_client")

RejectionHandler = Callable[[str, str], None]
"""Called with (event_id, reason) for every event or feedback refused or given up on."""

# Answers that say "not now" rather than "not this": the same request is sent again.
_TRY_LATER = frozenset({429, 502, 503, 504})


@dataclass(frozen=True)
class SenderConfig:
    base_url: str
    api_key: str | None
    batch_size: int
    max_batch_bytes: int
    flush_interval: float
    timeout: float
    max_retry_wait: float
    max_backoff: float
    server_error_attempts: int
    compress_level: int


class Sender:
    """Owns the HTTP connection and the thread; one per client per process."""

    def __init__(
        self, outbox: Outbox, config: SenderConfig, on_rejected: RejectionHandler | None
    ) -> None:
        self._outbox = outbox
        self._config = config
        self._on_rejected = on_rejected
        headers = {"User-Agent": "retrieval-monitor-client"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        self._http = httpx.Client(base_url=config.base_url, timeout=config.timeout, headers=headers)
        self._abandon = threading.Event()
        self._stopping = False
        self._carry: tuple[EventRecord, bytes] | None = None
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
        head = self._outbox.items[0] if self._carry is None else self._carry[0]
        if isinstance(head, FeedbackRecord):
            self._outbox.items.popleft()
            self._send_feedback(head)
        else:
            batch = self._take_events()
            if batch:
                self._send_events(batch)

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
                    self._settle_rejected(event.event_id, str(exc))
                    continue
            if batch and size + len(body) > self._config.max_batch_bytes:
                self._carry = (event, body)
                break
            batch.append((event, body))
            size += len(body)
        return batch

    # --- requests -------------------------------------------------------------------------------

    def _send_events(self, batch: list[tuple[EventRecord, bytes]]) -> None:
        body = gzip.compress(batch_body([b for _, b in batch]), self._config.compress_level)
        ids = [event.event_id for event, _ in batch]
        response = self._post(
            "/v1/events/batch",
            body,
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        if response is None:
            self._settle_failed(ids, "still unsent when the client was closed")
            return
        results = _json_field(response, "results") if response.status_code == 200 else None
        if not isinstance(results, list) or len(results) != len(ids):
            reason = _reason(response) if response.status_code != 200 else "malformed answer"
            self._settle_failed(ids, reason)
            return
        accepted = duplicate = 0
        # Results come in request order, one per event.
        for event_id, result in zip(ids, results, strict=True):
            status = result.get("status") if isinstance(result, dict) else None
            if status == "accepted":
                accepted += 1
            elif status == "duplicate":
                duplicate += 1
            else:
                error = result.get("error") if isinstance(result, dict) else None
                self._settle_rejected(event_id, str(error or f"status {status!r}"))
        self._outbox.settle(accepted=accepted, duplicate=duplicate)

    def _send_feedback(self, feedback: FeedbackRecord) -> None:
        url = f"/v1/events/{quote(feedback.event_id, safe='')}/feedback"
        body = json.dumps(feedback.body, separators=(",", ":")).encode()
        response = self._post(url, body, {"Content-Type": "application/json"})
        if response is None:
            self._settle_failed([feedback.event_id], "still unsent when the client was closed")
        elif response.is_success:
            self._outbox.settle(feedback_sent=1)
        elif response.is_client_error:
            self._settle_rejected(feedback.event_id, _reason(response))
        else:
            self._settle_failed([feedback.event_id], _reason(response))

    def _post(self, url: str, body: bytes, headers: dict[str, str]) -> httpx.Response | None:
        """POST until the monitor gives an answer that is not "later"; None once abandoned."""
        outage = 0
        server_errors = 0
        while not self._abandon.is_set():
            try:
                response = self._http.post(url, content=body, headers=headers)
            except httpx.TransportError as exc:
                self._note_unreachable(exc)
                wait = self._backoff(outage)
                outage += 1
            else:
                self._note_reachable()
                status = response.status_code
                if status in _TRY_LATER:
                    hinted = retry_after_seconds(
                        response.headers.get("Retry-After"), self._config.max_retry_wait
                    )
                    wait = self._backoff(outage) if hinted is None else hinted
                    outage += 1
                elif status >= 500 and server_errors + 1 < self._config.server_error_attempts:
                    server_errors += 1
                    wait = self._backoff(server_errors)
                else:
                    return response
            self._outbox.retries += 1
            self._abandon.wait(wait)
        return None

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


def _json_field(response: httpx.Response, name: str) -> Any:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get(name) if isinstance(body, dict) else None


def _reason(response: httpx.Response) -> str:
    detail = _json_field(response, "detail")
    text = detail if isinstance(detail, str) else response.text
    return f"HTTP {response.status_code}: {text}"[:500]
