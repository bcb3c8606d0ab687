"""The fields of a protobuf body counted on the wire agree with the parsed message's, and the
count stops past its limit however large the body."""

from __future__ import annotations

from google.protobuf.message import Message
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from service.ingest.otlp.wire_items import wire_items_over
from tests.support.otlp_bodies import (
    empty_spans_request,
    request_body,
    retriever_attributes,
    span_pb,
)

DESCRIPTOR = ExportTraceServiceRequest.DESCRIPTOR


def parsed_fields(message: Message) -> int:
    """Fields as they occur on the wire (a repeated field once per element), by walking."""
    count = 0
    for field, value in message.ListFields():
        values = value if field.is_repeated else [value]
        count += len(values)
        if field.message_type is not None:
            count += sum(parsed_fields(item) for item in values)
    return count


def test_the_count_is_the_parsed_message_s() -> None:
    documents: list[dict[str, object]] = [
        {"id": "d1", "content": "a passage", "score": 0.5},
        {"id": "d2", "content": "b"},
    ]
    body = request_body(
        span_pb("retrieve", retriever_attributes("a query", documents)),
        span_pb("retrieve", retriever_attributes("another", documents), span_id="a94ffa7280cb5f5f"),
    )
    fields = parsed_fields(ExportTraceServiceRequest.FromString(body))
    assert wire_items_over(body, DESCRIPTOR, fields // 2 - 1) == fields // 2
    assert wire_items_over(body, DESCRIPTOR, fields - 1) == fields
    assert wire_items_over(body, DESCRIPTOR, fields) is None


def test_a_huge_body_of_empty_spans_stops_at_the_limit() -> None:
    body = empty_spans_request(1_000_000)
    assert wire_items_over(body, DESCRIPTOR, 1_000) == 1_001
