"""OTLP/HTTP trace bodies, protobuf or JSON, decoded into plain spans.

Both encodings come out the same: ids as lower-case hex, attribute values as plain Python values
(str, bool, int, float, bytes, list, dict). Only spans with a ``select``-ed attribute value (say
``openinference.span.kind`` = ``RETRIEVER``) are converted; any other span costs one scan of its
attribute keys, since most spans of an instrumented app (LLM calls, chains, HTTP) never become
events and carry the largest values (prompts, completions).

OTLP/JSON is read by hand rather than with protobuf's ``json_format``: its trace and span ids are
hex strings, where ``json_format`` would expect base64, and its 64-bit integers and enums come as
strings or numbers.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from service.ingest.otlp.wire_items import WireError, wire_items_over

Encoding = Literal["protobuf", "json"]
Attributes = Mapping[str, object]
# Attribute key -> the values (compared in upper case) that make a span worth converting.
Selector = Mapping[str, frozenset[str]]

# Attribute values nest (arrays of key-value lists); real instrumentations stay far below this.
MAX_VALUE_DEPTH = 32


class PayloadError(ValueError):
    """The body is not a valid OTLP trace export request (answered with 400)."""


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    start_time_unix_nano: int
    attributes: Attributes
    resource: Attributes
    scope: str


@dataclass(frozen=True)
class DecodedRequest:
    spans: list[Span]  # the selected spans only
    total_spans: int


def decode(body: bytes, encoding: Encoding, select: Selector, max_items: int) -> DecodedRequest:
    """The request's spans; a protobuf body of more than ``max_items`` fields is refused before
    it is parsed (a JSON one was counted by the body limit already)."""
    if encoding == "protobuf":
        return decode_protobuf(body, select, max_items)
    return decode_json(body, select)


# --- protobuf ------------------------------------------------------------------------------------


def decode_protobuf(body: bytes, select: Selector, max_items: int) -> DecodedRequest:
    request = ExportTraceServiceRequest()
    try:
        items = wire_items_over(body, ExportTraceServiceRequest.DESCRIPTOR, max_items)
    except WireError as exc:
        raise PayloadError(f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None
    if items is not None:
        raise PayloadError(f"body holds more than {max_items} protobuf fields (max_body_items)")
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError) as exc:
        raise PayloadError(f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None
    spans: list[Span] = []
    total = 0
    for resource_spans in request.resource_spans:
        resource: Attributes | None = None
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                total += 1
                if not _selected_pb(span.attributes, select):
                    continue
                if resource is None:
                    resource = _pb_attributes(resource_spans.resource.attributes)
                spans.append(
                    Span(
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        name=span.name,
                        start_time_unix_nano=span.start_time_unix_nano,
                        attributes=_pb_attributes(span.attributes),
                        resource=resource,
                        scope=scope_spans.scope.name,
                    )
                )
    return DecodedRequest(spans, total)


def _selected_pb(pairs: Iterable[KeyValue], select: Selector) -> bool:
    for kv in pairs:
        wanted = select.get(kv.key)
        if wanted is not None and kv.value.string_value.upper() in wanted:
            return True
    return False


def _pb_attributes(pairs: Iterable[KeyValue]) -> dict[str, object]:
    return {kv.key: _pb_value(kv.value, 0) for kv in pairs}


def _pb_value(value: AnyValue, depth: int) -> object:
    if depth > MAX_VALUE_DEPTH:
        raise PayloadError(f"attribute values nested deeper than {MAX_VALUE_DEPTH}")
    which = value.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_pb_value(item, depth + 1) for item in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _pb_value(kv.value, depth + 1) for kv in value.kvlist_value.values}
    scalar: object = getattr(value, which)
    return scalar


# --- JSON ----------------------------------------------------------------------------------------


def decode_json(body: bytes, select: Selector) -> DecodedRequest:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise PayloadError(f"body is not JSON: {exc}") from None
    root = _object(document, "body")
    spans: list[Span] = []
    total = 0
    for i, raw_resource_spans in enumerate(_array(_get(root, "resourceSpans"), "resourceSpans")):
        where = f"resourceSpans[{i}]"
        resource_spans = _object(raw_resource_spans, where)
        resource: Attributes | None = None
        scopes = _array(_get(resource_spans, "scopeSpans"), f"{where}.scopeSpans")
        for j, raw_scope_spans in enumerate(scopes):
            scope_where = f"{where}.scopeSpans[{j}]"
            scope_spans = _object(raw_scope_spans, scope_where)
            scope = _object(_get(scope_spans, "scope") or {}, f"{scope_where}.scope")
            scope_name = _string(_get(scope, "name"), f"{scope_where}.scope.name")
            for n, raw_span in enumerate(
                _array(_get(scope_spans, "spans"), f"{scope_where}.spans")
            ):
                total += 1
                span_where = f"{scope_where}.spans[{n}]"
                span = _object(raw_span, span_where)
                pairs = _array(_get(span, "attributes"), f"{span_where}.attributes")
                if not _selected_json(pairs, select):
                    continue
                if resource is None:
                    raw_resource = _object(_get(resource_spans, "resource") or {}, where)
                    resource = _json_attributes(
                        _array(_get(raw_resource, "attributes"), f"{where}.resource.attributes"),
                        f"{where}.resource.attributes",
                    )
                spans.append(
                    Span(
                        trace_id=_hex_id(_get(span, "traceId"), f"{span_where}.traceId"),
                        span_id=_hex_id(_get(span, "spanId"), f"{span_where}.spanId"),
                        parent_span_id=_hex_id(
                            _get(span, "parentSpanId"), f"{span_where}.parentSpanId"
                        ),
                        name=_string(_get(span, "name"), f"{span_where}.name"),
                        start_time_unix_nano=_int64(
                            _get(span, "startTimeUnixNano"), f"{span_where}.startTimeUnixNano"
                        ),
                        attributes=_json_attributes(pairs, f"{span_where}.attributes"),
                        resource=resource,
                        scope=scope_name,
                    )
                )
    return DecodedRequest(spans, total)


def _selected_json(pairs: list[object], select: Selector) -> bool:
    for pair in pairs:
        key = pair.get("key") if isinstance(pair, dict) else None
        if not isinstance(key, str) or not isinstance(pair, dict):
            continue
        wanted = select.get(key)
        value = pair.get("value")
        if wanted is not None and isinstance(value, dict):
            text = value.get("stringValue")
            if isinstance(text, str) and text.upper() in wanted:
                return True
    return False


def _get(obj: Mapping[str, object], camel: str) -> object:
    """A field by its OTLP/JSON (lowerCamelCase) name, or the proto (snake_case) name."""
    if camel in obj:
        return obj[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return obj.get(snake)


def _object(value: object, where: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise PayloadError(f"{where}: expected a JSON object")
    return value


def _array(value: object, where: str) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PayloadError(f"{where}: expected a JSON array")
    return value


def _string(value: object, where: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PayloadError(f"{where}: expected a string")
    return value


def _int64(value: object, where: str) -> int:
    if value is None:
        return 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    if isinstance(value, float) and value.is_integer():
        return int(value)
    raise PayloadError(f"{where}: expected an integer (number or decimal string)")


def _hex_id(value: object, where: str) -> str:
    text = _string(value, where)
    try:
        return bytes.fromhex(text).hex()
    except ValueError:
        raise PayloadError(
            f"{where}: OTLP/JSON ids are hex strings, got {text[:40]!r}"
            + (" (base64, as protobuf's JSON mapping writes?)" if text.endswith("=") else "")
        ) from None


def _json_attributes(pairs: list[object], where: str) -> dict[str, object]:
    attributes: dict[str, object] = {}
    for i, raw in enumerate(pairs):
        pair = _object(raw, f"{where}[{i}]")
        key = _string(pair.get("key"), f"{where}[{i}].key")
        attributes[key] = _json_value(pair.get("value"), f"{where}[{i}].value", 0)
    return attributes


def _json_value(raw: object, where: str, depth: int) -> object:
    if depth > MAX_VALUE_DEPTH:
        raise PayloadError(f"{where}: attribute values nested deeper than {MAX_VALUE_DEPTH}")
    if raw is None:
        return None
    value = _object(raw, where)
    if "stringValue" in value:
        return _string(value["stringValue"], where)
    if "boolValue" in value:
        flag = value["boolValue"]
        if not isinstance(flag, bool):
            raise PayloadError(f"{where}.boolValue: expected true or false")
        return flag
    if "intValue" in value:
        return _int64(value["intValue"], f"{where}.intValue")
    if "doubleValue" in value:
        return _double(value["doubleValue"], f"{where}.doubleValue")
    if "arrayValue" in value:
        items = _object(value["arrayValue"] or {}, f"{where}.arrayValue")
        return [
            _json_value(item, f"{where}.arrayValue.values[{i}]", depth + 1)
            for i, item in enumerate(_array(items.get("values"), f"{where}.arrayValue.values"))
        ]
    if "kvlistValue" in value:
        kvlist = _object(value["kvlistValue"] or {}, f"{where}.kvlistValue")
        nested: dict[str, object] = {}
        for i, raw_pair in enumerate(_array(kvlist.get("values"), f"{where}.kvlistValue.values")):
            pair = _object(raw_pair, f"{where}.kvlistValue.values[{i}]")
            key = _string(pair.get("key"), f"{where}.kvlistValue.values[{i}].key")
            nested[key] = _json_value(pair.get("value"), f"{where}.kvlistValue", depth + 1)
        return nested
    if "bytesValue" in value:
        try:
            return base64.b64decode(_string(value["bytesValue"], where), validate=True)
        except binascii.Error:
            raise PayloadError(f"{where}.bytesValue: expected base64") from None
    return None


def _double(value: object, where: str) -> float:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        special = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        if value in special:
            return special[value]
        try:
            return float(value)
        except ValueError:
            pass
    raise PayloadError(f"{where}: expected a number")
