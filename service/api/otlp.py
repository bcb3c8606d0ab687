"""OTLP/HTTP trace receiver: apps already instrumented with OpenTelemetry send their retrievals.

Same key, tenant and limits as the event API; OTLP's answers: 200 with partial success naming the
spans that could not become events, 400 for a body that is no export request, 503 with
Retry-After when the database cannot take the events (the exporter retries).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import APIRouter, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from service.auth.callers import current_principal
from service.contract.schemas import EventIn
from service.contract.validate import Rejection, validate
from service.http.deps import StateDep
from service.http.state import AppState
from service.ingest.otlp.decode import Encoding, PayloadError, decode
from service.ingest.otlp.mapping import SELECT, MappingConfig, map_request
from service.ingest.otlp.responses import (
    MEDIA_TYPES,
    request_encoding,
    status_body,
    success_body,
)

log = logging.getLogger(__name__)

router = APIRouter(tags=["opentelemetry"])

# Enough of the reasons for an operator reading the exporter's log; the counters have the rest.
MAX_REASONS_IN_MESSAGE = 5

_BODY_DOC = {
    "requestBody": {
        "required": True,
        "description": "An OTLP ExportTraceServiceRequest; gzip with Content-Encoding: gzip.",
        "content": {
            "application/x-protobuf": {"schema": {"type": "string", "format": "binary"}},
            "application/json": {"schema": {"type": "object"}},
        },
    }
}


@router.post(
    "/v1/traces",
    response_class=Response,
    openapi_extra=_BODY_DOC,
    responses={
        200: {"description": "ExportTraceServiceResponse, with partial_success if spans failed."},
        400: {"description": "Not an OTLP export request (google.rpc.Status)."},
        401: {"description": "An API key is required or unknown (google.rpc.Status)."},
        415: {"description": "Content-Type is neither application/x-protobuf nor JSON."},
        503: {"description": "The events cannot be stored now; retry after Retry-After."},
    },
)
async def export_traces(request: Request, state: StateDep) -> Response:
    """OTLP/HTTP trace export: retriever and reranker spans become retrieval events."""
    encoding = request_encoding(request.headers.get("content-type", ""))
    if encoding is None:
        return otlp_error(
            415, "use Content-Type application/x-protobuf or application/json", "json"
        )
    body = await request.body()
    return await run_in_threadpool(_export, request, state, body, encoding)


def otlp_error(
    status: int, message: str, encoding: Encoding, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        status_body(status, message, encoding),
        status_code=status,
        media_type=MEDIA_TYPES[encoding],
        headers=headers,
    )


def _export(request: Request, state: AppState, body: bytes, encoding: Encoding) -> Response:
    settings = state.runtime.settings
    unavailable = {"Retry-After": str(settings.otlp_retry_after_seconds)}
    try:
        principal = current_principal(request, state)
    except HTTPException as exc:
        return otlp_error(exc.status_code, str(exc.detail), encoding, exc.headers)
    except Exception:  # the key store is the database: down means "retry later"
        log.exception("OTLP export: could not check the API key")
        return otlp_error(503, "temporarily unable to check the API key", encoding, unavailable)

    try:
        decoded = decode(body, encoding, SELECT, settings.max_body_items)
    except PayloadError as exc:
        return otlp_error(400, str(exc), encoding)
    mapped = map_request(decoded, MappingConfig.from_settings(settings))

    valid: list[EventIn] = []
    rejections: list[Rejection] = list(mapped.rejections)
    for raw in mapped.events:
        checked = validate(raw, state.runtime.settings, state.runtime.redactor)
        if isinstance(checked, Rejection):
            rejections.append(checked)
        else:
            valid.append(checked)
    limit = settings.max_batch_events
    if len(valid) > limit:
        rejections.extend(
            Rejection(event.event_id, "limits", f"more than max_batch_events {limit} in a request")
            for event in valid[limit:]
        )
        valid = valid[:limit]

    results = []
    if valid or rejections:
        try:
            results = state.ingestor.ingest(principal.tenant, valid, rejections)
        except Exception:
            log.exception("OTLP export: could not store %d event(s)", len(valid))
            return otlp_error(
                503, "temporarily unable to store the events; retry later", encoding, unavailable
            )

    reasons = [_reason(r.event_id, r.message) for r in rejections] + [
        _reason(r.event_id, r.error or "rejected") for r in results if r.status == "rejected"
    ]
    message = "; ".join(reasons[:MAX_REASONS_IN_MESSAGE])
    if len(reasons) > MAX_REASONS_IN_MESSAGE:
        message += f"; and {len(reasons) - MAX_REASONS_IN_MESSAGE} more"
    return Response(success_body(len(reasons), message, encoding), media_type=MEDIA_TYPES[encoding])


def _reason(event_id: str | None, message: str) -> str:
    return f"{event_id}: {message}" if event_id else message
