"""Replay a BEIR dataset through BM25 as live retrieval events posted to the API.

Each query becomes one v1 event: the top ``window`` passages BM25 returns (``k`` of them in the
prompt, the rest only for estimating how many relevant passages exist), optionally with the qrels as
gold ids. Event ids derive from (app, query id, seed), so replaying again is idempotent: the API
answers "duplicate" instead of counting an event twice.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from service.replay.beir import BeirDataset, load_beir
from service.replay.bm25 import Bm25Index
from service.replay.workload import generate_workload

_EVENT_ID_NAMESPACE = uuid.UUID("0b6c3f2e-8f1d-5a7e-9c41-3d2a6e5b7f10")
_MAX_RETRY_WAIT_SECONDS = 60.0
_MAX_REASON_CHARS = 500


class ReplayError(RuntimeError):
    """The replay cannot go on (the API cannot be reached)."""


@dataclass
class ReplayConfig:
    base_url: str
    dataset: Path | None = None
    """A BEIR folder; None generates a synthetic workload for the run."""
    k: int = 10
    window: int | None = None
    """Passages sent per event, k of them in the prompt; None means 2k (see DESIGN, ``k``)."""
    rate: float = 20.0
    """Events per second; 0 sends as fast as the API answers."""
    limit: int | None = None
    gold: bool = False
    app: str = "replay"
    retriever: str = "bm25"
    environment: str | None = None
    batch_size: int = 0
    """0 posts each event alone; n > 0 posts batches of n to /v1/events/batch."""
    api_key: str | None = None
    seed: int = 7
    progress: bool = True
    split: str = "test"
    workload_queries: int = 200
    timeout_seconds: float = 30.0
    max_retries: int = 5

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"k must be at least 1, got {self.k}")
        if self.window is not None and self.window < self.k:
            raise ValueError(f"window ({self.window}) must be at least k ({self.k})")
        if self.rate < 0:
            raise ValueError(f"rate must be 0 (unpaced) or positive, got {self.rate}")
        if self.batch_size < 0:
            raise ValueError(f"batch_size must be 0 or positive, got {self.batch_size}")
        if self.limit is not None and self.limit < 0:
            raise ValueError(f"limit must be positive, got {self.limit}")

    @property
    def passages_per_event(self) -> int:
        return self.window if self.window is not None else 2 * self.k


@dataclass
class ReplayReport:
    accepted: int = 0
    duplicate: int = 0
    rejected: int = 0
    """Refused by the API (4xx, or "rejected" in a batch): the event itself is at fault."""
    failed: int = 0
    """Server errors, or 429/503 still returned after every retry."""
    skipped: int = 0
    """Queries BM25 found no passage for: an event needs at least one."""
    retries: int = 0
    elapsed_seconds: float = 0.0
    event_ids: list[str] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    """(event_id, reason) of every rejected or failed event."""

    @property
    def sent(self) -> int:
        return len(self.event_ids)

    def summary(self) -> str:
        rate = self.sent / self.elapsed_seconds if self.elapsed_seconds > 0 else 0.0
        lines = [
            f"replayed {self.sent} events in {self.elapsed_seconds:.1f}s ({rate:.1f}/s): "
            f"{self.accepted} accepted, {self.duplicate} duplicate, {self.rejected} rejected, "
            f"{self.failed} failed, {self.skipped} skipped, {self.retries} retries"
        ]
        lines += [f"  {event_id}: {reason}" for event_id, reason in self.errors[:10]]
        if len(self.errors) > 10:
            lines.append(f"  ... and {len(self.errors) - 10} more")
        return "\n".join(lines)


def replay_event_id(app: str, query_id: str, seed: int) -> str:
    """The same (app, query, seed) always gives the same id, so a re-run is idempotent."""
    return str(uuid.uuid5(_EVENT_ID_NAMESPACE, json.dumps([app, query_id, seed])))


def build_event(
    query_id: str,
    query: str,
    hits: list[tuple[str, float]],
    dataset: BeirDataset,
    cfg: ReplayConfig,
) -> dict[str, Any]:
    """The v1 event JSON for one query and its ranked hits.

    The same inputs give the same JSON: there is no timestamp (the API stamps the arrival), since
    the API answers "duplicate" to a resend only when its content is unchanged.
    """
    shown = hits[: cfg.passages_per_event]
    if not shown:
        raise ValueError(f"query {query_id!r} has no passage to send")
    event: dict[str, Any] = {
        "event_id": replay_event_id(cfg.app, query_id, cfg.seed),
        "app": cfg.app,
        "retriever": cfg.retriever,
        "query": query,
        "passages": [
            {"id": doc_id, "text": dataset.corpus[doc_id].full_text, "score": score}
            for doc_id, score in shown
        ],
        # A retriever may find fewer than k passages; the prompt then carries all of them.
        "k": min(cfg.k, len(shown)),
        "metadata": {"source": "replay", "query_id": query_id},
    }
    if cfg.environment:
        event["environment"] = cfg.environment
    if cfg.gold:
        judged = dataset.qrels.get(query_id, {})
        event["gold_passage_ids"] = sorted(doc_id for doc_id, rel in judged.items() if rel > 0)
    return event


def run_replay(cfg: ReplayConfig) -> ReplayReport:
    """Send every query of the dataset (up to ``limit``) as an event; count the API's answers."""
    with ExitStack() as stack:
        path = cfg.dataset
        if path is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="rm-workload-"))
            path = generate_workload(Path(folder), cfg.workload_queries, cfg.seed)
        dataset = load_beir(path, cfg.split)
    index = Bm25Index.build({doc_id: doc.full_text for doc_id, doc in dataset.corpus.items()})
    query_ids = list(dataset.queries)[: cfg.limit]

    report = ReplayReport()
    # The key goes in both common places so it works whichever one the deployment checks.
    headers = {"Authorization": f"Bearer {cfg.api_key}", "X-API-Key": cfg.api_key or ""}
    per_request = max(cfg.batch_size, 1)
    pacer = _Pacer(cfg.rate)
    started = time.monotonic()
    with (
        httpx.Client(
            base_url=cfg.base_url,
            timeout=cfg.timeout_seconds,
            headers=headers if cfg.api_key else {},
        ) as client,
        tqdm(
            total=len(query_ids),
            desc="replay",
            unit="event",
            file=sys.stderr,
            disable=not cfg.progress,
        ) as progress,
    ):
        sender = _Sender(client, cfg, report)
        pending: list[dict[str, Any]] = []
        for position, query_id in enumerate(query_ids, start=1):
            query = dataset.queries[query_id]
            hits = index.search(query, cfg.passages_per_event)
            if hits:
                pending.append(build_event(query_id, query, hits, dataset, cfg))
            else:
                report.skipped += 1
                progress.update(1)
            if pending and (len(pending) == per_request or position == len(query_ids)):
                pacer.wait(len(pending))
                sender.send(pending)
                progress.update(len(pending))
                progress.set_postfix(
                    accepted=report.accepted,
                    duplicate=report.duplicate,
                    rejected=report.rejected,
                    refresh=False,
                )
                pending = []
    report.elapsed_seconds = time.monotonic() - started
    return report


class _Pacer:
    """Spaces requests so events leave at a steady ``rate`` per second on average.

    After a stall (a slow answer, a retry) the schedule restarts from now instead of bursting to
    catch up, so the API never sees more than the configured rate.
    """

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = time.monotonic()

    def wait(self, n_events: int) -> None:
        if not self._interval:
            return
        now = time.monotonic()
        if self._next > now:
            time.sleep(self._next - now)
        self._next = max(self._next, now) + n_events * self._interval


class _Sender:
    def __init__(self, client: httpx.Client, cfg: ReplayConfig, report: ReplayReport) -> None:
        self._client = client
        self._cfg = cfg
        self._report = report

    def send(self, events: list[dict[str, Any]]) -> None:
        self._report.event_ids.extend(event["event_id"] for event in events)
        if self._cfg.batch_size:
            self._send_batch(events)
        else:
            for event in events:
                self._send_one(event)

    def _send_one(self, event: dict[str, Any]) -> None:
        response = self._post("/v1/events", event)
        event_id = event["event_id"]
        if response.is_success:
            status = _json_field(response, "status")
            if status is None:
                status = "accepted" if response.status_code == 202 else "duplicate"
            self._count(event_id, str(status), None)
        elif response.is_client_error:
            self._count(event_id, "rejected", _reason(response))
        else:
            self._count(event_id, "failed", _reason(response))

    def _send_batch(self, events: list[dict[str, Any]]) -> None:
        response = self._post("/v1/events/batch", {"events": events})
        results = _json_field(response, "results") if response.is_success else None
        if not isinstance(results, list) or len(results) != len(events):
            status = "rejected" if response.is_client_error else "failed"
            reason = _reason(response) if not response.is_success else "malformed batch answer"
            for event in events:
                self._count(event["event_id"], status, reason)
            return
        # Results come in request order; the event's own id is kept in case the answer has none.
        for event, result in zip(events, results, strict=True):
            result = result if isinstance(result, dict) else {}
            self._count(event["event_id"], str(result.get("status")), result.get("error"))

    def _count(self, event_id: str, status: str, reason: str | None) -> None:
        report = self._report
        if status == "accepted":
            report.accepted += 1
        elif status == "duplicate":
            report.duplicate += 1
        else:
            if status == "rejected":
                report.rejected += 1
            else:
                report.failed += 1
            report.errors.append((event_id, reason or f"status {status!r}"))

    def _post(self, url: str, body: dict[str, Any]) -> httpx.Response:
        """POST, retrying 429/503 (honouring Retry-After) and connection errors."""
        attempt = 0
        while True:
            try:
                response = self._client.post(url, json=body)
            except httpx.TransportError as exc:
                if attempt >= self._cfg.max_retries:
                    raise ReplayError(f"cannot reach {self._cfg.base_url}: {exc}") from exc
                wait = _backoff(attempt)
            else:
                if response.status_code not in (429, 503) or attempt >= self._cfg.max_retries:
                    return response
                hinted = _retry_after(response)
                wait = _backoff(attempt) if hinted is None else hinted
            attempt += 1
            self._report.retries += 1
            time.sleep(wait)


def _backoff(attempt: int) -> float:
    return min(0.5 * 2.0**attempt, _MAX_RETRY_WAIT_SECONDS)


def _retry_after(response: httpx.Response) -> float | None:
    """Seconds to wait from a Retry-After header (delay in seconds or an HTTP date)."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = (parsedate_to_datetime(value) - datetime.now(UTC)).total_seconds()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), _MAX_RETRY_WAIT_SECONDS)


def _json_field(response: httpx.Response, name: str) -> Any:
    try:
        body = response.json()
    except ValueError:
        return None
    return body.get(name) if isinstance(body, dict) else None


def _reason(response: httpx.Response) -> str:
    """The API's own explanation when it gives one (FastAPI's ``detail``), else the body."""
    detail = _json_field(response, "detail")
    if detail is None:
        detail = _json_field(response, "error")
    text = (
        detail
        if isinstance(detail, str)
        else json.dumps(detail)
        if detail is not None
        else response.text
    )
    return f"HTTP {response.status_code}: {text}"[:_MAX_REASON_CHARS]
