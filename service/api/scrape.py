"""The Prometheus endpoint, ``/metrics``, and what a scrape needs done before it renders."""

from __future__ import annotations

from fastapi import APIRouter, Response

from service.http.deps import OPERATIONS_ACCESS, StateDep
from service.ingest.ingestor import Ingestor
from service.telemetry.exposition import CONTENT_TYPE
from service.telemetry.rebuild import rebuild_if_lost
from service.wiring.runtime import Runtime

router = APIRouter(tags=["operations"])


def before_scrape(runtime: Runtime, ingestor: Ingestor) -> None:
    """What a scrape needs first: this process's pending duplicate ratios exported (so an
    event accepted before the scrape is in it), and the aggregates rebuilt if Redis lost them."""
    ingestor.before_scrape()
    rebuild_if_lost(runtime)


@router.get("/metrics", response_class=Response, dependencies=[OPERATIONS_ACCESS])
def metrics(state: StateDep) -> Response:
    """Prometheus text exposition of every series (global totals, the same on every replica)."""
    return Response(state.metrics_page.render(), media_type=CONTENT_TYPE)
