"""The events of one call stored in one transaction, then counted and pushed to the judge queue.

The order is the guarantee: nothing is acknowledged before it is committed, and nothing is
enqueued before it is committed (a task never looks for an event that is not there yet).
Each event is triaged first (its initial state goes into the INSERT itself); after the commit
the counters and the judge messages leave in one Redis round trip, and the near-duplicate ratios
are handed to ``deferred`` to be counted after the answer.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

from sqlalchemy.exc import IntegrityError

from service.contract.schemas import EventIn, IngestResult
from service.contract.validate import Rejection
from service.ingest.backpressure import Backpressure
from service.ingest.counts import IngestCounts, count_rejected
from service.ingest.deferred import DuplicateRatios, PendingRatio
from service.ingest.judge_queue import CounterUpdate, JudgeQueue
from service.ingest.triage import Triage, initial_states
from service.primitives.clock import utcnow
from service.store import events as event_store
from service.store.engine import session_scope
from service.telemetry.aggregates import Delta
from service.wiring.runtime import Runtime

log = logging.getLogger(__name__)

CONFLICT_MESSAGE = "event_id already used for a different event"


def new_event_id() -> str:
    return uuid.uuid4().hex


class Ingestor:
    """Stores validated events and hands them on: counters and judging now, ratios later."""

    def __init__(
        self,
        runtime: Runtime,
        judge_queue: JudgeQueue,
        backpressure: Backpressure | None = None,
    ) -> None:
        self.runtime = runtime
        self.judge_queue = judge_queue
        # Shared with admission, which refuses work while commits are slow.
        self.backpressure = backpressure or Backpressure(runtime)
        self.duplicate_ratios = DuplicateRatios(runtime.aggregates)

    def ingest(
        self, tenant: str, events: Sequence[EventIn], rejections: Sequence[Rejection] = ()
    ) -> list[IngestResult]:
        """Commit the valid events, then count and enqueue; results in the order given."""
        settings = self.runtime.settings
        named = [(event.event_id or new_event_id(), event) for event in events]
        triage: dict[str, Triage] = {}
        for event_id, event in named:
            # An id repeated in the batch is stored once, as its first occurrence.
            if event_id not in triage:
                triage[event_id] = Triage.of(event_id, event, settings)
        initial = initial_states(triage)
        hashes = {event_id: chosen.content_hashes for event_id, chosen in triage.items()}
        with session_scope(self.runtime.engine) as session:
            try:
                started = time.perf_counter()
                stored = event_store.insert_events(
                    session, tenant, named, utcnow(), initial, hashes
                )
                session.commit()
                self.backpressure.record_commit(time.perf_counter() - started)
            except Exception as exc:
                # IntegrityError: another request inserted one of these ids between our check
                # and our insert. A refused value: one event's own fault, so it alone fails.
                if not isinstance(exc, IntegrityError) and not event_store.refused_by_store(exc):
                    raise
                if not isinstance(exc, IntegrityError):
                    log.warning(
                        "the database refused a batch of %d (%s); storing the events one by one",
                        len(named),
                        type(exc).__name__,
                    )
                session.rollback()
                stored = event_store.insert_events_one_by_one(
                    session, tenant, named, utcnow(), initial, hashes
                )

        delta = Delta(tenant)
        counts = IngestCounts()
        results: list[IngestResult] = []
        new_pks: list[int] = []
        urgent_pks: list[int] = []
        ratios: list[PendingRatio] = []
        for (event_id, event), outcome in zip(named, stored, strict=True):
            key = (event.app, event.retriever, event.environment or "")
            if outcome.outcome == "accepted":
                assert outcome.pk is not None
                chosen = triage[event_id]
                if chosen.judge:
                    (urgent_pks if chosen.urgent else new_pks).append(outcome.pk)
                counts.accepted(key, chosen.judge, chosen.reason, chosen.signals)
                ratios.append(PendingRatio(tenant, key, chosen.duplicates, chosen.signals.passages))
                results.append(IngestResult(event_id=outcome.event_id, status="accepted"))
            elif outcome.outcome == "duplicate":
                counts.duplicate(key)
                results.append(IngestResult(event_id=outcome.event_id, status="duplicate"))
            elif outcome.outcome == "refused":
                count_rejected(delta, "invalid")
                results.append(
                    IngestResult(
                        event_id=outcome.event_id, status="rejected", error=outcome.refusal
                    )
                )
            else:
                count_rejected(delta, "conflict")
                results.append(
                    IngestResult(
                        event_id=outcome.event_id, status="rejected", error=CONFLICT_MESSAGE
                    )
                )
        counts.add_to(delta)
        for rejection in rejections:
            count_rejected(delta, rejection.reason, empty_retrieval=rejection.empty_retrieval)
        # Committed already: a failed push leaves the events pending, and the sweeper sends them.
        self.judge_queue.push(
            new_pks,
            urgent_pks,
            CounterUpdate(self.runtime.aggregates, settings.redis_url, delta),
        )
        self.duplicate_ratios.submit(ratios)
        return results

    def before_scrape(self) -> None:
        """What a scrape of this process must see first: the pending duplicate ratios exported,
        so an event accepted before the scrape is in it."""
        self.duplicate_ratios.flush()

    def close(self) -> None:
        """Send held judge messages and export the last duplicate ratios (at shutdown)."""
        self.judge_queue.close()
        self.duplicate_ratios.close()
