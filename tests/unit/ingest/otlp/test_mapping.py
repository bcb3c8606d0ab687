"""OTLP spans to events, without a server: both encodings decoded to the same spans, retriever
and reranker spans mapped as each instrumentation writes them, the naming rules and k, and the
reason a span cannot become an event.

Request bodies are built with the real OTLP protobuf classes.

Tests ``service.ingest.otlp.decode``, ``service.ingest.otlp.documents`` and
``service.ingest.otlp.rules``.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanPb
from pydantic import ValidationError

from service.config.settings import Settings
from service.contract.validate import Rejection
from service.ingest.otlp.decode import PayloadError, Span, decode
from service.ingest.otlp.mapping import SELECT, MappingConfig, map_request, map_span
from service.primitives.hashing import text_hash
from service.store.events import passage_key
from tests.support.otlp_bodies import (
    DOCS,
    START_NS,
    TRACE_ID,
    as_otlp_json,
    mapped,
    only_event,
    request_body,
    retriever_attributes,
    span_pb,
)


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
    decoded = decode(request_body(nested, llm, http), "protobuf", SELECT, Settings().max_body_items)
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
    from_pb = decode(body, "protobuf", SELECT, Settings().max_body_items)
    from_json = decode(as_otlp_json(body), "json", SELECT, Settings().max_body_items)
    assert from_json == from_pb
    assert from_pb.spans[0].attributes["ids"] == ["x", "y"]

    # Numbers as strings, enums as numbers, snake_case names: all read the same.
    loose = json.loads(as_otlp_json(body))
    span = loose["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["kind"] = 1
    span["start_time_unix_nano"] = int(span.pop("startTimeUnixNano"))
    span["attributes"].append({"key": "n", "value": {"intValue": "7"}})
    span["attributes"].append({"key": "x", "value": {"doubleValue": "NaN"}})
    (decoded,) = decode(json.dumps(loose).encode(), "json", SELECT, Settings().max_body_items).spans
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
        decode(body, "json", SELECT, Settings().max_body_items)


def test_a_non_protobuf_body_is_a_payload_error() -> None:
    with pytest.raises(PayloadError):
        decode(b"\xff\xff\xff\xff", "protobuf", SELECT, Settings().max_body_items)
