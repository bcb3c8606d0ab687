"""Where the pipeline stands at scrape time: judge tasks queued, events pending and how long the
oldest has waited. Read from the database and the queues, so every replica reports the same."""

from __future__ import annotations

from service.queue import urgent_queue
from service.runtime import Runtime
from service.store.engine import session_scope
from service.store.events import pending_summary, utcnow
from service.telemetry.exporter import PipelineState


def read_pipeline_state(runtime: Runtime) -> PipelineState:
    with session_scope(runtime.engine) as session:
        pending = pending_summary(session)
    age = (
        (utcnow() - pending.oldest_received_at).total_seconds()
        if pending.oldest_received_at
        else 0.0
    )
    queues = (runtime.settings.queue_name, urgent_queue(runtime.settings.queue_name))
    # One round trip for both queues: every round trip of a scrape adds to its time.
    with runtime.redis.pipeline(transaction=False) as pipe:
        for queue in queues:
            pipe.llen(queue)
        depths = pipe.execute()
    return PipelineState(
        queue_depth={queue: int(d) for queue, d in zip(queues, depths, strict=True)},
        pending_events=pending.count,
        oldest_pending_age_seconds=max(age, 0.0),
    )
