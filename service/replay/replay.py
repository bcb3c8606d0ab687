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
from pathlib import Path
from typing import Any

from retrieval_monitor_client import MonitorClient
from tqdm import tqdm

from service.replay.beir import BeirDataset, load_beir
from service.replay.bm25 import Bm25Index
from service.replay.workload import generate_workload

_EVENT_ID_NAMESPACE = uuid.UUID("0b6c3f2e-8f1d-5a7e-9c41-3d2a6e5b7f10")
# Events held by the client at once: the replay waits below this, so nothing is ever dropped.
_MAX_HELD = 2_000


class ReplayError(RuntimeError):
    """The replay cannot go on (the API answers nothing)."""


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
    """Most events per request to /v1/events/batch; 0 leaves it to the client (100)."""
    api_key: str | None = None
    seed: int = 7
    progress: bool = True
    split: str = "test"
    workload_queries: int = 200
    timeout_seconds: float = 30.0
    stall_seconds: float = 60.0
    """Give up once the API has answered nothing for this long (it is down or unreachable)."""

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
    """Given up: a request the API refused as a whole (a bad key, a lasting server error)."""
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
    """Send every query of the dataset (up to ``limit``) as an event; count the API's answers.

    Events go through the client library, as an application's would: batched, compressed,
    retried after 429/503 or an outage with the same ids. The replay waits for room instead of
    letting the client drop, and gives up once nothing has been answered for ``stall_seconds``.
    """
    with ExitStack() as stack:
        path = cfg.dataset
        if path is None:
            folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="rm-workload-"))
            path = generate_workload(Path(folder), cfg.workload_queries, cfg.seed)
        dataset = load_beir(path, cfg.split)
    index = Bm25Index.build({doc_id: doc.full_text for doc_id, doc in dataset.corpus.items()})
    query_ids = list(dataset.queries)[: cfg.limit]

    report = ReplayReport()
    options: dict[str, Any] = {} if not cfg.batch_size else {"batch_size": cfg.batch_size}
    monitor = MonitorClient(
        cfg.base_url,
        app=cfg.app,
        retriever=cfg.retriever,
        environment=cfg.environment,
        api_key=cfg.api_key,
        max_pending=_MAX_HELD,
        flush_interval=0.2,
        timeout=cfg.timeout_seconds,
        # The same query must give the same event on every run, so the API can say "duplicate".
        send_timestamps=False,
        on_rejected=lambda event_id, reason: report.errors.append((event_id, reason)),
        **options,
    )
    pacer = _Pacer(cfg.rate)
    started = time.monotonic()
    with tqdm(
        total=len(query_ids),
        desc="replay",
        unit="event",
        file=sys.stderr,
        disable=not cfg.progress,
    ) as progress:
        watch = _Progress(monitor, cfg.base_url, progress, cfg.stall_seconds)
        try:
            for query_id in query_ids:
                query = dataset.queries[query_id]
                hits = index.search(query, cfg.passages_per_event)
                if not hits:
                    report.skipped += 1
                    continue
                event = build_event(query_id, query, hits, dataset, cfg)
                pacer.wait(1)
                while monitor.stats().pending >= _MAX_HELD:
                    watch.wait_a_little()
                report.event_ids.append(event["event_id"])
                monitor.record(
                    event["query"],
                    event["passages"],
                    k=event["k"],
                    gold_passage_ids=event.get("gold_passage_ids"),
                    metadata=event["metadata"],
                    event_id=event["event_id"],
                )
                watch.show()
            while monitor.stats().pending:
                watch.wait_a_little()
        finally:
            stats = monitor.close(timeout=0)
    report.accepted, report.duplicate = stats.accepted, stats.duplicate
    report.rejected, report.retries = stats.rejected, stats.retries
    report.failed = stats.failed + stats.dropped
    report.elapsed_seconds = time.monotonic() - started
    return report


class _Progress:
    """Keeps the bar on what the API answered, and notices when it stops answering."""

    def __init__(
        self, monitor: MonitorClient, url: str, bar: tqdm[Any], stall_seconds: float
    ) -> None:
        self._monitor = monitor
        self._url = url
        self._bar = bar
        self._stall_seconds = stall_seconds
        self._answered = 0
        self._last_answer = time.monotonic()

    def show(self) -> None:
        stats = self._monitor.stats()
        answered = stats.accepted + stats.duplicate + stats.rejected + stats.failed
        now = time.monotonic()
        if answered != self._answered:
            self._bar.update(answered - self._answered)
            self._bar.set_postfix(
                accepted=stats.accepted,
                duplicate=stats.duplicate,
                rejected=stats.rejected,
                refresh=False,
            )
            self._answered, self._last_answer = answered, now
        elif stats.pending and now - self._last_answer > self._stall_seconds:
            raise ReplayError(
                f"no answer from {self._url} for {self._stall_seconds:.0f} s; "
                f"{stats.pending} events unsent"
            )

    def wait_a_little(self) -> None:
        self._monitor.flush(0.2)
        self.show()


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
