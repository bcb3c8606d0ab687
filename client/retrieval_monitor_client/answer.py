"""The monitor's answer, read within bounds and understood without ever raising.

The body is streamed and reading stops past ``max_bytes`` (counted after decompression) or once
the request's time is up, so a huge, endless or trickling answer costs the application at most
that much memory and time. Parsing takes whatever arrived: garbage, truncated or absurdly nested
JSON reads as "no usable field", never as an exception on the sender thread.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import httpx


@dataclass(frozen=True)
class Answer:
    status: int
    retry_after: str | None
    body: bytes
    complete: bool
    """False when the body was cut at the size or time bound, or could not be decoded."""

    @property
    def is_success(self) -> bool:
        return 200 <= self.status < 300

    def field(self, name: str) -> Any:
        """``name`` of the JSON object in the body; None if the body is not a whole JSON object."""
        if not self.complete:
            return None
        try:
            parsed = json.loads(self.body)
        except (ValueError, RecursionError):
            return None
        return parsed.get(name) if isinstance(parsed, dict) else None

    def reason(self) -> str:
        """``HTTP <status>: <detail>``, short enough for a log line or ``on_rejected``."""
        detail = self.field("detail")
        if not isinstance(detail, str):
            detail = self.body[:500].decode("utf-8", "replace")
        return f"HTTP {self.status}: {detail}"[:500]


def read_answer(response: httpx.Response, max_bytes: int, seconds: float) -> Answer:
    """Read ``response``'s body up to ``max_bytes`` or for up to ``seconds``, then stop.

    A connection that breaks while the body arrives raises ``httpx.TransportError``, like one
    that breaks before: the request is sent again.
    """
    deadline = time.monotonic() + seconds
    chunks: list[bytes] = []
    size = 0
    complete = True
    try:
        for chunk in response.iter_bytes():
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes or time.monotonic() > deadline:
                complete = False
                break
    except httpx.DecodingError:
        complete = False
    return Answer(
        status=response.status_code,
        retry_after=response.headers.get("Retry-After"),
        body=b"".join(chunks)[: max_bytes + 1],
        complete=complete,
    )


def batch_outcomes(answer: Answer, count: int) -> list[tuple[str, str]] | str:
    """Per event of the batch, in order, ``(status, reason)``; or why the whole batch failed.

    ``status`` is "accepted", "duplicate" or "rejected"; anything else the monitor says of an
    event reads as a rejection naming it, and an answer without one result per event fails the
    batch.
    """
    if answer.status != 200:
        return answer.reason()
    results = answer.field("results")
    if not isinstance(results, list) or len(results) != count:
        return "malformed answer" if answer.complete else "answer cut at its size or time bound"
    return [_outcome(result) for result in results]


def _outcome(result: object) -> tuple[str, str]:
    if not isinstance(result, dict):
        return "rejected", "malformed result"
    status = result.get("status")
    if status in ("accepted", "duplicate"):
        return status, ""
    error = result.get("error")
    if isinstance(error, str) and error:
        return "rejected", error[:500]
    shown = repr(status[:100]) if isinstance(status, str) else "no status"
    return "rejected", f"status {shown}"
