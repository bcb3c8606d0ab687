"""Rebuilding the shared aggregates from the database after Redis lost them.

Runs when the epoch marker is missing (a fresh Redis, a restart without persistence, FLUSHALL).
The one process that claims the epoch counts accepted events from the database and re-exports
every score with the same once-only markers the workers use, so a worker exporting the same event
at the same moment cannot make it count twice.
"""

from __future__ import annotations

import logging
import threading
import time

from service.primitives.clock import utcnow
from service.store import events as event_store
from service.store import judging as judging_store
from service.store.engine import session_scope
from service.telemetry.aggregates import Delta
from service.telemetry.judged_export import ExportLabels, done_key, score_delta
from service.telemetry.parts import ProcessParts

log = logging.getLogger(__name__)
PAGE = 2_000


def ensure_aggregates(runtime: ProcessParts) -> bool:
    """Rebuild if needed; True when this call did the rebuild."""
    aggregates = runtime.aggregates
    if aggregates.has_epoch():
        return False
    started = time.time()
    if not aggregates.start_epoch(started):
        return False
    cutoff = utcnow()
    with session_scope(runtime.engine) as session:
        accepted = Delta()
        for tenant, app, retriever, environment, count in event_store.accepted_counts(
            session, cutoff
        ):
            labels = {
                "tenant": tenant,
                "app": app,
                "retriever": retriever,
                "environment": environment,
            }
            accepted.inc("events_accepted", labels, count)
        if accepted:
            aggregates.force_add(accepted)
        exported = 0
        after = 0
        while page := judging_store.scored_events(session, after, PAGE):
            for scored in page:
                who = ExportLabels(
                    tenant=scored.tenant,
                    app=scored.app,
                    retriever=scored.retriever,
                    environment=scored.environment,
                    judge=scored.score.judge,
                    prompt_version=scored.score.prompt_version,
                    judged_passages=scored.judged_passages,
                )
                key = done_key(scored.event_pk, who.judge, who.prompt_version)
                if aggregates.add_once(
                    key,
                    score_delta(
                        who,
                        scored.score.model_dump(),
                        scored.run.model_dump() if scored.run is not None else None,
                    ),
                ):
                    exported += 1
            after = page[-1].score.id or after
    log.info(
        "rebuilt shared aggregates from the database",
        extra={"scores": exported, "seconds": round(time.time() - started, 3)},
    )
    return True


def ensure_aggregates_in_background(runtime: ProcessParts) -> None:
    def run() -> None:
        try:
            ensure_aggregates(runtime)
        except Exception:
            log.warning("could not rebuild the shared aggregates", exc_info=True)

    threading.Thread(target=run, name="rebuild-aggregates", daemon=True).start()


def rebuild_if_lost(runtime: ProcessParts) -> None:
    """Before a scrape: start a rebuild when the aggregates are gone; the scrape never waits."""
    if not runtime.aggregates.has_epoch():
        ensure_aggregates_in_background(runtime)
