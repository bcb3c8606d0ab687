"""OTLP/HTTP ingest: decoding both encodings, mapping spans to events, and the receiver's answers.

Request bodies are built with the real OTLP protobuf classes; the receiver runs in the real app
with the real database and Redis.

Tests ``service.api.otlp`` and ``service.ingest.otlp.responses``.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)
from sqlalchemy import create_engine, text

from service.config.settings import Settings
from tests.support.environment import make_settings
from tests.support.metrics_reading import metric_value
from tests.support.otlp_bodies import (
    DOCS,
    TRACE_ID,
    as_otlp_json,
    otlp_app,
    request_body,
    retriever_attributes,
    span_pb,
)

# --- building requests ---------------------------------------------------------------------------


# --- mapping -------------------------------------------------------------------------------------


# --- the receiver --------------------------------------------------------------------------------


@pytest.fixture
def otlp_client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(otlp_app(settings)) as client:
        yield client


PB = {"content-type": "application/x-protobuf"}
EVENT_ID = f"otel:{TRACE_ID.hex()}:a94ffa7280cb5f5e"


def export_response(response: Any) -> ExportTraceServiceResponse:
    assert response.headers["content-type"] == "application/x-protobuf"
    return ExportTraceServiceResponse.FromString(response.content)


def test_export_stores_the_event_once_and_a_reexport_is_a_duplicate(
    otlp_client: TestClient,
) -> None:
    body = request_body(span_pb("R", retriever_attributes("rotate api key", DOCS)))
    first = otlp_client.post("/v1/traces", content=body, headers=PB)
    assert first.status_code == 200
    assert not export_response(first).HasField("partial_success")
    stored = otlp_client.get(f"/v1/events/{EVENT_ID}").json()
    assert stored["status"] == "pending"
    assert [p["id"] for p in stored["passages"]] == ["kb-1", "kb-2"]
    assert stored["app"] == "shop"

    again = otlp_client.post(
        "/v1/traces",
        content=gzip.compress(body),
        headers={**PB, "content-encoding": "gzip"},
    )
    assert again.status_code == 200
    assert not export_response(again).HasField("partial_success")
    assert metric_value(otlp_client, "retrieval_monitor_events_accepted_total") == 1
    assert metric_value(otlp_client, "retrieval_monitor_events_duplicate_total") == 1


def test_json_export_answers_json(otlp_client: TestClient) -> None:
    body = as_otlp_json(request_body(span_pb("R", retriever_attributes("q", DOCS))))
    response = otlp_client.post(
        "/v1/traces", content=body, headers={"content-type": "application/json; charset=utf-8"}
    )
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {}
    assert otlp_client.get(f"/v1/events/{EVENT_ID}").status_code == 200


def test_spans_that_cannot_become_events_are_a_partial_success(
    otlp_client: TestClient, settings: Settings
) -> None:
    too_long = "x" * (settings.max_passage_chars + 1)
    good = span_pb("R", retriever_attributes("q", DOCS))
    over_limit = span_pb("R", retriever_attributes("q", [{"content": too_long}]), "01" * 8)
    no_text = span_pb("R", retriever_attributes("q", [{"id": "d1"}]), "02" * 8)
    response = otlp_client.post(
        "/v1/traces", content=request_body(good, over_limit, no_text), headers=PB
    )
    assert response.status_code == 200
    partial = export_response(response).partial_success
    assert partial.rejected_spans == 2
    assert "max_passage_chars" in partial.error_message
    assert "has no text" in partial.error_message
    assert otlp_client.get(f"/v1/events/{EVENT_ID}").status_code == 200
    assert otlp_client.get(f"/v1/events/otel:{TRACE_ID.hex()}:{'01' * 8}").status_code == 404
    assert metric_value(otlp_client, "retrieval_monitor_events_rejected_total") == 2


def test_the_batch_limit_applies_to_retrieval_spans(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    from service.store.migrate import upgrade

    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, max_batch_events=1)
    first = span_pb("R", retriever_attributes("q", DOCS))
    second = span_pb("R", retriever_attributes("q", DOCS), "01" * 8)
    body = as_otlp_json(request_body(first, second))
    with TestClient(otlp_app(settings)) as client:
        response = client.post(
            "/v1/traces", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 200
        partial = response.json()["partialSuccess"]
        assert int(partial["rejectedSpans"]) == 1
        assert "max_batch_events 1" in partial["errorMessage"]
        assert client.get(f"/v1/events/{EVENT_ID}").status_code == 200


def test_bad_payloads_are_400_with_a_status_in_the_request_encoding(
    otlp_client: TestClient,
) -> None:
    response = otlp_client.post("/v1/traces", content=b"\xff\xff\xff\xff", headers=PB)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/x-protobuf"
    status = status_pb2.Status.FromString(response.content)
    assert status.code == 3  # INVALID_ARGUMENT
    assert "ExportTraceServiceRequest" in status.message

    response = otlp_client.post(
        "/v1/traces", content=b"{", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    assert response.json()["code"] == 3

    response = otlp_client.post("/v1/traces", content=b"x", headers={"content-type": "text/plain"})
    assert response.status_code == 415


def test_an_empty_export_succeeds(otlp_client: TestClient) -> None:
    response = otlp_client.post("/v1/traces", content=b"", headers=PB)
    assert response.status_code == 200
    assert response.content == b""  # an empty ExportTraceServiceResponse


def test_the_body_limit_applies(tmp_path: Path, sqlite_url: str, redis_url: str) -> None:
    from service.store.migrate import upgrade

    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, max_body_bytes=4096)
    body = request_body(span_pb("R", retriever_attributes("q", [{"content": "w " * 4000}])))
    with TestClient(otlp_app(settings)) as client:
        plain = client.post("/v1/traces", content=body, headers=PB)
        zipped = client.post(
            "/v1/traces",
            content=gzip.compress(body),
            headers={**PB, "content-encoding": "gzip"},
        )
    assert len(gzip.compress(body)) < 4096 < len(body)
    assert (plain.status_code, zipped.status_code) == (413, 413)


def test_the_api_key_decides_the_tenant(tmp_path: Path, sqlite_url: str, redis_url: str) -> None:
    from service.auth.keys import key_hash, new_key
    from service.primitives.clock import utcnow
    from service.store import keys as keys_repository
    from service.store.engine import get_engine, session_scope
    from service.store.migrate import upgrade

    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, auth_required=True)
    key = new_key()
    with session_scope(get_engine(sqlite_url)) as session:
        keys_repository.add_key(session, "acme", key_hash(key), "otel", False, utcnow())
        session.commit()
    body = request_body(span_pb("R", retriever_attributes("q", DOCS)))
    with TestClient(otlp_app(settings)) as client:
        anonymous = client.post("/v1/traces", content=body, headers=PB)
        assert anonymous.status_code == 401
        assert status_pb2.Status.FromString(anonymous.content).code == 16  # UNAUTHENTICATED
        wrong = client.post("/v1/traces", content=body, headers={**PB, "x-api-key": "rm_nope"})
        assert wrong.status_code == 401
        ok = client.post(
            "/v1/traces", content=body, headers={**PB, "authorization": f"Bearer {key}"}
        )
        assert ok.status_code == 200
    engine = create_engine(sqlite_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT tenant, event_id FROM events")).all()
    engine.dispose()
    assert rows == [("acme", EVENT_ID)]


def test_a_database_outage_is_503_with_retry_after(tmp_path: Path, redis_url: str) -> None:
    unreachable = "postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2"
    settings = make_settings(tmp_path, unreachable, redis_url, otlp_retry_after_seconds=7)
    body = request_body(span_pb("R", retriever_attributes("q", DOCS)))
    with TestClient(otlp_app(settings)) as client:
        response = client.post("/v1/traces", content=body, headers=PB)
        as_json = client.post(
            "/v1/traces", content=as_otlp_json(body), headers={"content-type": "application/json"}
        )
    assert response.status_code == 503
    assert response.headers["retry-after"] == "7"
    assert status_pb2.Status.FromString(response.content).code == 14  # UNAVAILABLE
    assert as_json.status_code == 503
    assert as_json.json()["code"] == 14
