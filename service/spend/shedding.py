"""Shedding a backlog the judge cannot keep up with: each tenant's oldest normal-priority events
past the bound are skipped (reason ``shed``, counted) so the wait of the rest stays bounded. The
bound is per tenant: a tenant's flood sheds only its own events. Gold and urgent events stay."""

from __future__ import annotations

from service.store import spend as spend_repository
from service.store.engine import session_scope
from service.telemetry.aggregates import Delta
from service.wiring.runtime import Runtime

SHED_BATCH = 10_000


def shed_backlog(runtime: Runtime) -> int:
    """Skip what each tenant has over ``shed_max_pending``; the number of events shed."""
    bound = runtime.settings.shed_max_pending
    if bound <= 0:
        return 0
    with session_scope(runtime.engine) as session:
        victims = spend_repository.sheddable_backlog(session, bound, SHED_BATCH)
        shed = set(spend_repository.mark_skipped(session, [v.pk for v in victims], "shed"))
        session.commit()
    delta = Delta()
    for victim in victims:
        if victim.pk in shed:
            labels = {
                "tenant": victim.tenant,
                "app": victim.app,
                "retriever": victim.retriever,
                "environment": victim.environment,
                "reason": "shed",
            }
            delta.inc("events_skipped", labels)
    runtime.aggregates.add(delta)
    return len(shed)
