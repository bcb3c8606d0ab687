"""What routes get from the application state."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

from fastapi import Request

from service.analysis.gauges import CachedCalibrationGauges
from service.api.keys import KeyStore
from service.api.sessions import SessionStore
from service.ingest.accept import Ingestor
from service.ingest.dispatch import GatheringSender
from service.ingest.group_commit import GroupCommitter
from service.queue import urgent_queue
from service.runtime import Runtime
from service.spend.budget import BudgetGauges
from service.store.engine import session_scope
from service.store.events import pending_summary, utcnow
from service.telemetry.exporter import MetricsPage, PipelineState
from service.telemetry.rebuild import ensure_aggregates_in_background


@dataclass
class AppState:
    runtime: Runtime
    ingestor: Ingestor
    metrics_page: MetricsPage
    committer: GroupCommitter  # the single-event path's writer; started and drained by the app
    keys: KeyStore
    sessions: SessionStore

    @classmethod
    def build(cls, runtime: Runtime) -> AppState:
        sender = GatheringSender(
            runtime.settings.redis_url,
            runtime.settings.queue_name,
            runtime.settings.judge_slice_events,
            runtime.settings.judge_gather_seconds,
        )

        def pipeline_state() -> PipelineState:
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

        def before_scrape() -> None:
            if not runtime.aggregates.has_epoch():
                ensure_aggregates_in_background(runtime)

        calibration = CachedCalibrationGauges(runtime.engine)
        budgets = BudgetGauges(runtime.redis, runtime.settings)
        metrics_page = MetricsPage(
            runtime.aggregates,
            pipeline_state,
            before_scrape,
            extra=lambda: chain(calibration(), budgets()),
        )
        ingestor = Ingestor(runtime, sender)
        group = runtime.settings.max_batch_events
        # PostgreSQL takes concurrent writers, so a second one stores a group while the first
        # waits on the server; SQLite has one write lock, which a second writer would only wait
        # for (its busy handler sleeps between retries).
        writers = 1 if runtime.engine.dialect.name == "sqlite" else 2
        return cls(
            runtime=runtime,
            ingestor=ingestor,
            # A group is at most a batch; one more group may wait while one is being stored.
            committer=GroupCommitter(ingestor.ingest, group, capacity=group, writers=writers),
            metrics_page=metrics_page,
            keys=KeyStore(runtime.engine, runtime.redis),
            sessions=SessionStore(runtime.redis),
        )


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.rm
    return state


async def request_state(request: Request) -> AppState:
    """``app_state`` as a route dependency. FastAPI runs a sync dependency in the thread pool;
    that hop costs far more than this attribute read, and every ingest request paid it."""
    return app_state(request)
