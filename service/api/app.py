"""The FastAPI application: routes, the body limit, and error answers that never become a 500."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from service.api import analysis, calibration, events, gold, health, otlp, scrape
from service.api.body_limit import BodyLimitMiddleware, InflightBudget
from service.api.docs import add_docs
from service.api.heap import freeze_startup_objects
from service.api.http_metrics import HttpMetricsMiddleware, HttpResponseCounter
from service.auth.cross_site import CrossSiteWriteGuard
from service.auth.gate import TENANT_STATE, AuthGateMiddleware
from service.config.settings import Settings
from service.contract.validate import empty_retrieval_labels
from service.contract.validation_errors import (
    breaks_a_count_limit,
    errors_summary,
    reported_errors,
)
from service.http.query_params import QueryParamsGuard
from service.http.request_scope import RequestScopeMiddleware
from service.http.state import AppState
from service.ingest.counts import count_refused
from service.store.db_check import warn_if_statistics_go_stale
from service.store.models import DEFAULT_TENANT
from service.telemetry.rebuild import ensure_aggregates
from service.ui.routes import router as ui_router
from service.wiring.runtime import Runtime

log = logging.getLogger(__name__)

DESCRIPTION = """\
Measures the quality of a RAG application's retrieval on live traffic. Send each retrieval as an
event; an LLM judge grades the passages in the background; measures (precision, nDCG, T, F_e,
context relevance, and recall with gold traffic) are exported on `/metrics` for Prometheus.
"""


def create_app(settings: Settings) -> FastAPI:
    runtime = Runtime(settings)
    state = AppState.build(runtime, scrape.before_scrape)
    responses = HttpResponseCounter(runtime.aggregates)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        try:
            ensure_aggregates(runtime)
        except Exception:  # Redis or the database down at start: /metrics retries on scrape
            log.warning("shared aggregates not checked at startup", exc_info=True)
        warn_if_statistics_go_stale(runtime.engine)
        responses.start()
        state.committer.start()
        freeze_startup_objects()
        yield
        # uvicorn has let the requests in flight finish; whatever is still queued is committed
        # or failed here, before the engine goes.
        state.committer.close()
        state.ingestor.close()
        responses.stop()
        runtime.engine.dispose()

    app = FastAPI(
        title="retrieval-monitor",
        version="1",
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # served by service.api.docs without a CDN
        redoc_url=None,
    )
    add_docs(app)
    app.state.rm = state
    # Innermost: every route's body is validated, and so counted and masked, inside this scope.
    app.add_middleware(RequestScopeMiddleware, redactor=runtime.redactor, settings=settings)
    app.add_middleware(
        BodyLimitMiddleware,
        max_bytes=settings.max_body_bytes,
        timeout_seconds=settings.body_timeout_seconds,
        budget=InflightBudget(settings.max_inflight_body_bytes),
        max_items=settings.max_body_items,
        max_depth=settings.max_body_depth,
    )
    # Every route's query string is checked before routing: a value no filter, store or
    # computation can take is a 422, never a failure deeper in.
    app.add_middleware(QueryParamsGuard)
    # Outside the body limit: the key is checked before any body is read or inflated.
    app.add_middleware(
        AuthGateMiddleware,
        keys=state.keys,
        sessions=state.sessions,
        required=settings.auth_required,
        max_unauthenticated_body_bytes=settings.max_unauthenticated_body_bytes,
    )
    # Outside the key check: a write another site started is refused for every route, with keys
    # on or off, before anything else is looked at.
    app.add_middleware(CrossSiteWriteGuard)
    # Added last, so it is outermost and also counts what the body limit answers itself.
    app.add_middleware(HttpMetricsMiddleware, counter=responses)
    app.include_router(events.router)
    app.include_router(otlp.router)
    app.include_router(analysis.router)
    app.include_router(calibration.router)
    app.include_router(gold.router)
    app.include_router(health.router)
    app.include_router(scrape.router)
    app.include_router(ui_router)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        failures = exc.errors()
        if request.url.path.startswith("/v1/events") and request.method == "POST":
            empty = empty_retrieval_labels(exc.body)
            reason = "empty_retrieval" if empty else "invalid"
            count_refused(
                runtime.aggregates,
                getattr(request.state, TENANT_STATE, DEFAULT_TENANT),
                "limits" if breaks_a_count_limit(failures) else reason,
                empty_retrieval=empty,
            )
        return JSONResponse(
            status_code=422,
            content={"detail": errors_summary(failures), "errors": reported_errors(failures)},
        )

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        # Dependencies that are down (database, Redis) are the expected cause: say so with a
        # 503 the client can retry, and keep the traceback in the log.
        log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(
            status_code=503,
            content={"detail": "temporarily unable to serve the request; retry later"},
            headers={"Retry-After": "5"},
        )

    return app
