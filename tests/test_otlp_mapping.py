"""OTLP/HTTP ingest: decoding both encodings, mapping spans to events, and the receiver's answers.

Request bodies are built with the real OTLP protobuf classes; the receiver runs in the real app
with the real database and Redis.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from google.protobuf import json_format
from google.rpc import status_pb2  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanPb
from pydantic import ValidationError
from sqlalchemy import create_engine, text

from service.api import otlp
from service.api.app import create_app
from service.ingest.accept import Rejection
from service.ingest.otlp.decode import PayloadError, Span, decode
from service.ingest.otlp.mapping import SELECT, MappingConfig, map_request, map_span
from service.settings import Settings
from service.store.events import passage_key, text_hash
from tests.conftest import make_settings

TRACE_ID = bytes.fromhex("5b8efff798038103d269b633813fc60c")
START_NS = 1_795_975_863_219_776_123


# --- building requests ---------------------------------------------------------------------------


def otlp_app(settings: Settings) -> FastAPI:
    """The real app, with the OTLP receiver mounted if the app does not mount it yet."""
    app = create_app(settings)
    if not any(getattr(route, "path", None) == "/v1/traces" for route in app.routes):
        app.include_router(otlp.router)
    return app


def any_value(value: object) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, list):
        wrapped = AnyValue()
        wrapped.array_value.values.extend(any_value(v) for v in value)
        return wrapped
    return AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, object]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


def span_pb(
    name: str, attributes: Mapping[str, object], span_id: str = "a94ffa7280cb5f5e"
) -> SpanPb:
    return SpanPb(
        trace_id=TRACE_ID,
        span_id=bytes.fromhex(span_id),
        name=name,
        start_time_unix_nano=START_NS,
        end_time_unix_nano=START_NS + 1_000_000,
        attributes=key_values(attributes),
    )


def request_body(*spans: SpanPb, resource: Mapping[str, object] | None = None) -> bytes:
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                scope_spans=[ScopeSpans(spans=list(spans))],
            )
        ]
    )
    request.resource_spans[0].resource.attributes.extend(
        key_values(resource if resource is not None else {"service.name": "shop"})
    )
    request.resource_spans[0].scope_spans[0].scope.name = "openinference.instrumentation.test"
    return request.SerializeToString()


def as_otlp_json(body: bytes) -> bytes:
    """The same request in OTLP/JSON: protobuf's JSON mapping with the ids turned into hex."""
    document = json_format.MessageToDict(ExportTraceServiceRequest.FromString(body))
    hex_ids(document)
    return json.dumps(document).encode()


def hex_ids(node: object) -> None:
    import base64

    if isinstance(node, dict):
        for key, value in node.items():
            if key in {"traceId", "spanId", "parentSpanId"} and isinstance(value, str):
                node[key] = base64.b64decode(value).hex()
            else:
                hex_ids(value)
    elif isinstance(node, list):
        for item in node:
            hex_ids(item)


def retriever_attributes(
    query: str, documents: Sequence[Mapping[str, object]], **extra: object
) -> dict[str, object]:
    attributes: dict[str, object] = {"openinference.span.kind": "RETRIEVER", "input.value": query}
    for i, document in enumerate(documents):
        for field, value in document.items():
            attributes[f"retrieval.documents.{i}.document.{field}"] = value
    attributes.update(extra)
    return attributes


def mapped(body: bytes, settings: Settings | None = None) -> list[dict[str, Any] | Rejection]:
    config = MappingConfig.from_settings(settings or Settings())
    outcomes = [map_span(span, config) for span in decode(body, "protobuf", SELECT).spans]
    return [outcome for outcome in outcomes if outcome is not None]


def only_event(body: bytes, settings: Settings | None = None) -> dict[str, Any]:
    (event,) = mapped(body, settings)
    assert isinstance(event, dict), event
    return event


DOCS = [
    {"id": "kb-1", "content": "rotate a key in settings", "score": 2.5},
    {"id": "kb-2", "content": "billing runs monthly", "score": 1.0},
]


# --- mapping -------------------------------------------------------------------------------------


def test_an_openinference_retriever_span_becomes_one_event() -> None:
    body = request_body(
        span_pb("VectorIndexRetriever.retrieve", retriever_attributes("rotate api key", DOCS)),
        resource={"service.name": "support-bot", "deployment.environment.name": "prod"},
    )
    event = only_event(body)
    assert event["event_id"] == f"otel:{TRACE_ID.hex()}:a94ffa7280cb5f5e"
    assert (event["app"], event["retriever"], event["environment"]) == (
        "support-bot",
        "VectorIndexRetriever",
        "prod",
    )
    assert event["query"] == "rotate api key"
    assert event["passages"] == [
        {"id": "kb-1", "text": "rotate a key in settings", "score": 2.5},
        {"id": "kb-2", "text": "billing runs monthly", "score": 1.0},
    ]
    assert "k" not in event  # all passages reached the prompt
    assert "candidates" not in event
    assert event["timestamp"] == "2026-11-29T18:11:03.219776+00:00"
    assert datetime.fromisoformat(event["timestamp"]).tzinfo == UTC
    assert event["metadata"]["otel.span_name"] == "VectorIndexRetriever.retrieve"


def test_documents_are_ranked_by_their_index_not_by_attribute_order() -> None:
    docs = [{"id": f"d{i}", "content": f"text {i}"} for i in range(12)]
    attributes = retriever_attributes("q", docs)
    shuffled = dict(sorted(attributes.items(), reverse=True))
    event = only_event(request_body(span_pb("R", shuffled)))
    assert [p["id"] for p in event["passages"]] == [f"d{i}" for i in range(12)]


def test_a_retriever_span_without_documents_is_skipped_and_other_spans_are_not_decoded() -> None:
    nested = span_pb(
        "ToyRetriever._retrieve",
        {"openinference.span.kind": "RETRIEVER", "input.value": '{"qb": {"query_str": "q"}}'},
        span_id="0000000000000001",
    )
    llm = span_pb("LLM.complete", {"openinference.span.kind": "LLM", "input.value": "hi"}, "02" * 8)
    http = span_pb("GET /", {"http.method": "GET"}, span_id="0000000000000003")
    decoded = decode(request_body(nested, llm, http), "protobuf", SELECT)
    assert decoded.total_spans == 3
    assert [s.name for s in decoded.spans] == ["ToyRetriever._retrieve"]
    result = map_request(decoded, MappingConfig.from_settings(Settings()))
    assert (result.events, result.rejections, result.ignored) == ([], [], 1)


def test_passages_without_ids_get_stable_content_hash_ids() -> None:
    docs = [{"content": "same words"}, {"content": "other words"}, {"content": "same words"}]
    body = request_body(span_pb("R", retriever_attributes("q", docs)))
    first, second = only_event(body), only_event(body)
    expected = passage_key(None, text_hash("same words"))
    assert [p["id"] for p in first["passages"]] == [
        expected,
        passage_key(None, text_hash("other words")),
        f"{expected}#2",  # a repeated passage keeps its own rank
    ]
    assert first == second


def test_a_reranker_span_gives_passages_and_first_stage_candidates() -> None:
    attributes: dict[str, object] = {
        "openinference.span.kind": "RERANKER",
        "reranker.query": "rotate api key",
        "reranker.model_name": "cross-encoder-v2",
        "reranker.top_k": 2,
    }
    inputs = [("kb-7", "a", 0.3), ("kb-1", "rotate a key", 0.9), (None, "keys expire", 0.5)]
    for i, (doc_id, content, score) in enumerate(inputs):
        if doc_id:
            attributes[f"reranker.input_documents.{i}.document.id"] = doc_id
        attributes[f"reranker.input_documents.{i}.document.content"] = content
        attributes[f"reranker.input_documents.{i}.document.score"] = score
    outputs = [(None, "keys expire", 3.1), ("kb-1", "rotate a key", 2.2)]
    for i, (doc_id, content, score) in enumerate(outputs):
        if doc_id:
            attributes[f"reranker.output_documents.{i}.document.id"] = doc_id
        attributes[f"reranker.output_documents.{i}.document.content"] = content
        attributes[f"reranker.output_documents.{i}.document.score"] = score
    event = only_event(request_body(span_pb("CrossEncoderRerank.postprocess", attributes)))
    hashed = passage_key(None, text_hash("keys expire"))
    assert event["retriever"] == "cross-encoder-v2"
    assert event["query"] == "rotate api key"
    assert [(p["id"], p["score"]) for p in event["passages"]] == [(hashed, 3.1), ("kb-1", 2.2)]
    # The unnamed candidate and passage get the same content id, so the stages line up.
    assert event["candidates"] == [
        {"id": "kb-7", "score": 0.3},
        {"id": "kb-1", "score": 0.9},
        {"id": hashed, "score": 0.5},
    ]


def traceloop_span(
    name: str, kind: str, query_input: object, nodes: list[tuple[str, str, float]]
) -> SpanPb:
    output = [
        json.dumps({"node": {"id_": i, "text": t, "metadata": {}}, "score": s}) for i, t, s in nodes
    ]
    return span_pb(
        name,
        {
            "traceloop.span.kind": kind,
            "traceloop.entity.name": name,
            "traceloop.entity.input": json.dumps(query_input),
            "traceloop.entity.output": json.dumps(output),
        },
    )


def test_traceloop_retriever_tasks_map_and_their_wrappers_do_not() -> None:
    nodes = [("4", "dielectric constant", 1.0), ("2", "analogue computer", 0.25)]
    inner = traceloop_span("ToyRetriever.task", "task", {"qb": {"query_str": "liquids"}}, nodes)
    event = only_event(request_body(inner))
    assert event["query"] == "liquids"
    assert event["retriever"] == "ToyRetriever"
    assert [(p["id"], p["text"], p["score"]) for p in event["passages"]] == nodes
    assert event["metadata"]["otel.source"] == "traceloop"

    # The public retrieve() around it reports the same documents: a workflow at the top of a
    # trace, a task inside a query engine. Neither is a second event.
    outer = {"str_or_query_bundle": "liquids"}
    workflow = traceloop_span("ToyRetriever.workflow", "workflow", outer, nodes)
    assert not mapped(request_body(workflow))
    assert not mapped(request_body(traceloop_span("ToyRetriever.task", "task", outer, nodes)))
    # A query engine's own task returning nodes is not a retriever.
    engine = traceloop_span("RetrieverQueryEngine.task", "task", {"query_bundle": "x"}, nodes)
    assert not mapped(request_body(engine))


def test_naming_rules_and_k_come_from_settings() -> None:
    attributes = retriever_attributes(
        "q",
        [{"content": f"t{i}"} for i in range(5)],
        metadata=json.dumps({"ls_retriever_name": "bm25", "retrieval_monitor.k": 3}),
    )
    body = request_body(span_pb("BM25Retriever", attributes), resource={"service.name": "svc"})
    event = only_event(body)
    assert (event["app"], event["retriever"], event["k"]) == ("svc", "bm25", 3)

    custom = Settings(
        otlp_app_rules=("resource:team", "const:fallback-app"),
        otlp_retriever_rules=("name",),
        otlp_environment_rules=("const:staging",),
        otlp_k_rules=("attr:metadata.ls_retriever_name", "const:99"),
    )
    event = only_event(body, custom)
    assert (event["app"], event["retriever"], event["environment"]) == (
        "fallback-app",
        "BM25Retriever",
        "staging",
    )
    assert event["k"] == 5  # a k above the document count is the whole list


def test_a_bad_rule_is_refused_at_startup() -> None:
    with pytest.raises(ValidationError, match="invalid rule"):
        Settings(otlp_app_rules=("service.name",))


def test_langchain_ids_come_from_the_output_when_it_matches() -> None:
    docs = [{"content": "alpha text"}, {"content": "beta text"}]
    output = {
        "documents": [
            {"id": "a-1", "page_content": "alpha text", "metadata": {}},
            {"id": "b-1", "page_content": "beta text", "metadata": {}},
        ]
    }
    attributes = retriever_attributes(
        "q", docs, **{"output.value": json.dumps(output), "output.mime_type": "application/json"}
    )
    assert [p["id"] for p in only_event(request_body(span_pb("R", attributes)))["passages"]] == [
        "a-1",
        "b-1",
    ]
    output["documents"][1]["page_content"] = "something else"
    attributes["output.value"] = json.dumps(output)
    ids = [p["id"] for p in only_event(request_body(span_pb("R", attributes)))["passages"]]
    assert ids == [passage_key(None, text_hash(t)) for t in ("alpha text", "beta text")]


def test_unusable_retrieval_spans_are_rejections_with_a_reason() -> None:
    hidden = retriever_attributes("q", [{"id": "d1"}, {"id": "d2", "content": "x"}])
    no_query = retriever_attributes("", DOCS)
    outcomes = mapped(request_body(span_pb("A", hidden), span_pb("B", no_query, "ab" * 8)))
    assert all(isinstance(o, Rejection) for o in outcomes)
    messages = [o.message for o in outcomes if isinstance(o, Rejection)]
    assert "document 0 has no text" in messages[0]
    assert "no query" in messages[1]

    zero_trace = Span("0" * 32, "1" * 16, "", "R", 0, retriever_attributes("q", DOCS), {}, "")
    rejected = map_span(zero_trace, MappingConfig.from_settings(Settings()))
    assert isinstance(rejected, Rejection)
    assert "invalid trace or span id" in rejected.message


def test_otlp_json_decodes_to_the_same_spans_as_protobuf() -> None:
    body = request_body(span_pb("R", retriever_attributes("q", DOCS, flag=True, ids=["x", "y"])))
    from_pb = decode(body, "protobuf", SELECT)
    from_json = decode(as_otlp_json(body), "json", SELECT)
    assert from_json == from_pb
    assert from_pb.spans[0].attributes["ids"] == ["x", "y"]

    # Numbers as strings, enums as numbers, snake_case names: all read the same.
    loose = json.loads(as_otlp_json(body))
    span = loose["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["kind"] = 1
    span["start_time_unix_nano"] = int(span.pop("startTimeUnixNano"))
    span["attributes"].append({"key": "n", "value": {"intValue": "7"}})
    span["attributes"].append({"key": "x", "value": {"doubleValue": "NaN"}})
    (decoded,) = decode(json.dumps(loose).encode(), "json", SELECT).spans
    assert decoded.start_time_unix_nano == START_NS
    assert decoded.attributes["n"] == 7


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "expected a JSON object"),
        (b'{"resourceSpans": {}}', "expected a JSON array"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "W47/95gDgQPSabYzgT/GDA==",'
            b' "attributes": [{"key": "openinference.span.kind",'
            b' "value": {"stringValue": "RETRIEVER"}}]}]}]}]}',
            "ids are hex strings",
        ),
    ],
)
def test_malformed_json_is_a_payload_error(body: bytes, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        decode(body, "json", SELECT)


def test_a_non_protobuf_body_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        decode(b"\xff\xff\xff\xff", "protobuf", SELECT)


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


def metric_value(client: TestClient, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(client.get("/metrics").text)
        for sample in family.samples
        if sample.name == name
    )


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
    from service.api.keys import key_hash, new_key
    from service.store import keys as keys_repository
    from service.store.engine import get_engine, session_scope
    from service.store.events import utcnow
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
