"""Where the pipeline stands at scrape time: judge tasks queued, and per tenant the events pending
and how long the oldest has waited. Read from the database and the queues, so every replica
reports the same.

A tenant's pending series exist while it has an active key (0 when nothing waits), and the default
tenant's always, so a drained backlog reads 0 rather than vanishing, and the number of series is
the number of tenants, which only an admin creates."""

from __future__ import annotations

import logging

from service.primitives.clock import utcnow
from service.queue.names import urgent_queue
from service.store.engine import session_scope
from service.store.events import pending_by_tenant
from service.store.keys import key_tenants
from service.store.models import DEFAULT_TENANT
from service.telemetry.exporter import PipelineState
from service.telemetry.parts import ProcessParts

log = logging.getLogger(__name__)


def read_pipeline_state(runtime: ProcessParts) -> PipelineState:
    with session_scope(runtime.engine) as session:
        pending = pending_by_tenant(session)
        tenants = key_tenants(session) | {DEFAULT_TENANT} | set(pending)
    now = utcnow()
    ages = {
        tenant: max((now - summary.oldest_received_at).total_seconds(), 0.0)
        for tenant, summary in pending.items()
        if summary.oldest_received_at is not None
    }
    queues = (runtime.settings.queue_name, urgent_queue(runtime.settings.queue_name))
    try:
        depth = runtime.broker_queues.depths(queues)
    except Exception:  # a broker apart (RM_BROKER_URL) that is down: the rest still renders
        log.warning("could not read the judge queues' depth from the broker", exc_info=True)
        depth = {}
    return PipelineState(
        queue_depth=depth,
        pending_events={t: pending[t].count if t in pending else 0 for t in sorted(tenants)},
        oldest_pending_age_seconds={t: ages.get(t, 0.0) for t in sorted(tenants)},
    )
