"""OTLP/HTTP trace requests built with the real OTLP protobuf classes, and the mapping of one
request's spans to events, for the OTLP tests."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as SpanPb

from service.api import otlp
from service.api.app import create_app
from service.config.settings import Settings
from service.contract.validate import Rejection
from service.ingest.otlp.decode import decode
from service.ingest.otlp.mapping import SELECT, MappingConfig, map_span

TRACE_ID = bytes.fromhex("5b8efff798038103d269b633813fc60c")


START_NS = 1_795_975_863_219_776_123


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
    outcomes = [
        map_span(span, config)
        for span in decode(body, "protobuf", SELECT, Settings().max_body_items).spans
    ]
    return [outcome for outcome in outcomes if outcome is not None]


def only_event(body: bytes, settings: Settings | None = None) -> dict[str, Any]:
    (event,) = mapped(body, settings)
    assert isinstance(event, dict), event
    return event


DOCS = [
    {"id": "kb-1", "content": "rotate a key in settings", "score": 2.5},
    {"id": "kb-2", "content": "billing runs monthly", "score": 1.0},
]


def otlp_app(settings: Settings) -> FastAPI:
    """The real app, with the OTLP receiver mounted if the app does not mount it yet."""
    app = create_app(settings)
    if not any(getattr(route, "path", None) == "/v1/traces" for route in app.routes):
        app.include_router(otlp.router)
    return app


def empty_spans_request(count: int) -> bytes:
    """An ExportTraceServiceRequest of one resource, one scope and ``count`` empty spans, written
    on the wire by hand (two bytes a span): the body with the most messages per byte."""
    spans = b"\x12\x00" * count
    scope = b"\x12" + _varint(len(spans)) + spans
    return b"\x0a" + _varint(len(scope)) + scope


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)
