"""OTLP/HTTP answers, in the encoding of the request.

Success is an ``ExportTraceServiceResponse`` (with ``partial_success`` when spans were rejected);
an error is a ``google.rpc.Status``. Status has two scalar fields, written here by hand so the
service needs no second protobuf package for them.
"""

from __future__ import annotations

import json

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from service.ingest.otlp.decode import Encoding

MEDIA_TYPES: dict[Encoding, str] = {
    "protobuf": "application/x-protobuf",
    "json": "application/json",
}

# google.rpc.Code for the HTTP statuses the endpoint answers.
RPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 413: 8, 415: 3, 429: 8, 500: 13, 503: 14}


def request_encoding(content_type: str) -> Encoding | None:
    """The OTLP encoding a Content-Type names, or None for one OTLP/HTTP does not define."""
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type in {"application/x-protobuf", "application/protobuf"}:
        return "protobuf"
    if media_type == "application/json":
        return "json"
    return None


def success_body(rejected_spans: int, error_message: str, encoding: Encoding) -> bytes:
    response = ExportTraceServiceResponse()
    if rejected_spans or error_message:
        response.partial_success.rejected_spans = rejected_spans
        response.partial_success.error_message = error_message
    if encoding == "protobuf":
        return response.SerializeToString()
    return json_format.MessageToJson(response, indent=None).encode()


def status_body(http_status: int, message: str, encoding: Encoding) -> bytes:
    code = RPC_CODES.get(http_status, 2)  # 2: UNKNOWN
    if encoding == "json":
        return json.dumps({"code": code, "message": message}).encode()
    text = message.encode()
    return b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)
