"""The application's long-lived parts, built once per app and reached from every request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from fastapi import Request

from service.analysis.gauges import CachedAgreementGauges, CachedCalibrationGauges
from service.auth.keys import KeyStore
from service.auth.scrape_token import read_scrape_token
from service.auth.sessions import SessionStore
from service.ingest.admission import Admission
from service.ingest.backpressure import Backpressure
from service.ingest.group_commit import GroupCommitter
from service.ingest.ingestor import Ingestor
from service.ingest.judge_queue import JudgeQueue
from service.spend.budget import BudgetGauges
from service.telemetry.exporter import MetricsPage, PipelineGauges
from service.telemetry.pipeline import read_pipeline_state
from service.wiring.runtime import Runtime


@dataclass
class AppState:
    runtime: Runtime
    admission: Admission
    ingestor: Ingestor
    metrics_page: MetricsPage
    committer: GroupCommitter  # the single-event path's writer; started and drained by the app
    keys: KeyStore
    sessions: SessionStore
    scrape_token: str | None = None  # accepted on /metrics only (RM_METRICS_TOKEN_FILE)

    @classmethod
    def build(
        cls, runtime: Runtime, before_scrape: Callable[[Runtime, Ingestor], None]
    ) -> AppState:
        """The parts of one app; ``before_scrape`` is what ``/metrics`` does before it renders."""
        judge_queue = JudgeQueue(
            runtime.settings.judge_broker_url,
            runtime.settings.queue_name,
            runtime.settings.judge_slice_events,
            runtime.settings.judge_gather_seconds,
        )
        backpressure = Backpressure(runtime)
        ingestor = Ingestor(runtime, judge_queue, backpressure)
        metrics_page = MetricsPage(
            runtime.aggregates,
            collectors=(
                PipelineGauges(partial(read_pipeline_state, runtime)),
                CachedCalibrationGauges(runtime.engine),
                CachedAgreementGauges(runtime.engine),
                BudgetGauges(runtime.redis, runtime.settings),
            ),
            before_scrape=lambda: before_scrape(runtime, ingestor),
        )
        group = runtime.settings.max_batch_events
        # PostgreSQL takes concurrent writers, so a second one stores a group while the first
        # waits on the server; SQLite has one write lock, which a second writer would only wait
        # for (its busy handler sleeps between retries).
        writers = 1 if runtime.engine.dialect.name == "sqlite" else 2
        return cls(
            runtime=runtime,
            admission=Admission(runtime, backpressure),
            ingestor=ingestor,
            # A group is at most a batch; one more group may wait while one is being stored.
            committer=GroupCommitter(ingestor.ingest, group, capacity=group, writers=writers),
            metrics_page=metrics_page,
            keys=KeyStore(runtime.engine, runtime.redis),
            sessions=SessionStore(runtime.redis),
            scrape_token=read_scrape_token(runtime.settings.metrics_token_file),
        )


def app_state(request: Request) -> AppState:
    state: AppState = request.app.state.rm
    return state
