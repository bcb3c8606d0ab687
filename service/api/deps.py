"""What routes get from the application state."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain

from fastapi import Request
from prometheus_client import CollectorRegistry

from service.analysis.gauges import CachedCalibrationGauges
from service.auth import KeyStore
from service.budget import BudgetGauges
from service.db import session_scope
from service.exporter import PipelineState, SharedCollector, build_registry
from service.ingest import Ingestor
from service.queue import TaskSender, urgent_queue
from service.rebuild import ensure_aggregates_in_background
from service.repository import pending_summary, utcnow
from service.runtime import Runtime


@dataclass
class AppState:
    runtime: Runtime
    ingestor: Ingestor
    registry: CollectorRegistry
    keys: KeyStore

    @classmethod
    def build(cls, runtime: Runtime) -> AppState:
        sender = TaskSender(
            runtime.settings.redis_url,
            runtime.settings.queue_name,
            runtime.settings.judge_slice_events,
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
            return PipelineState(
                queue_depth={queue: int(runtime.redis.llen(queue)) for queue in queues},
                pending_events=pending.count,
                oldest_pending_age_seconds=max(age, 0.0),
            )

        def before_scrape() -> None:
            if not runtime.aggregates.has_epoch():
                ensure_aggregates_in_background(runtime)

        calibration = CachedCalibrationGauges(runtime.engine)
        budgets = BudgetGauges(runtime.redis, runtime.settings)
        registry = build_registry(
            SharedCollector(
                runtime.aggregates,
                pipeline_state,
                before_scrape,
                extra=lambda: chain(calibration(), budgets()),
            )
        )
        return cls(
            runtime=runtime,
            ingestor=Ingestor(runtime, sender),
            registry=registry,
            keys=KeyStore(runtime.engine),
        )


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.rm
    return state
