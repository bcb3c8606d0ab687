"""OTLP bodies an exporter might send, however odd their attributes: every answer is a 200 (with
a partial_success naming the spans that could not become events) or a 400, never a 503 that
would make the exporter retry the batch forever; and mapping is linear in the documents."""

from __future__ import annotations

import base64
import json
import string
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from google.protobuf import json_format
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from service.api.app import create_app
from service.config.settings import Settings
from service.ingest.otlp.decode import decode
from service.ingest.otlp.mapping import SELECT, MappingConfig, map_request
from tests.support.environment import make_settings

TEXT = st.one_of(
    st.text(string.ascii_letters + " ", min_size=1, max_size=10),
    st.text(st.characters(codec="utf-8"), max_size=10),
    st.sampled_from(["\x00", "\u2028", "{" * 3000, "[" * 3000, '{"a": ' * 200 + "1" + "}" * 200]),
)
# Where an index or a number goes: ASCII, other scripts' digits, superscripts, huge numbers.
INDEX = st.one_of(st.integers(0, 4).map(str), st.sampled_from(["²", "٣", "0x1", "-1", "9" * 30]))
DOCUMENT_FIELD = st.sampled_from(["id", "content", "score", "metadata"])


def any_value(depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    scalars = st.one_of(
        TEXT.map(lambda t: {"stringValue": t}),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: {"intValue": str(i)}),
        st.sampled_from(["99999999999999999999999999", "x"]).map(lambda i: {"intValue": i}),
        st.floats(allow_nan=False).map(lambda f: {"doubleValue": f}),
        st.booleans().map(lambda b: {"boolValue": b}),
    )
    if depth >= 3:
        return scalars
    inner = st.deferred(lambda: any_value(depth + 1))
    return st.one_of(
        scalars,
        st.lists(inner, max_size=2).map(lambda v: {"arrayValue": {"values": v}}),
        st.lists(st.tuples(TEXT, inner), max_size=2).map(
            lambda kv: {"kvlistValue": {"values": [{"key": k, "value": v} for k, v in kv]}}
        ),
    )


@st.composite
def spans(draw: st.DrawFn, number: int) -> dict[str, Any]:
    kind = draw(st.sampled_from(["RETRIEVER", "RERANKER", "retriever", "LLM"]))
    prefix = "retrieval.documents" if kind.upper() == "RETRIEVER" else "reranker.output_documents"
    attributes = [
        {"key": "openinference.span.kind", "value": {"stringValue": kind}},
        {"key": "input.value", "value": draw(any_value())},
    ]
    for _ in range(draw(st.integers(0, 6))):
        key = f"{prefix}.{draw(INDEX)}.document.{draw(DOCUMENT_FIELD)}"
        attributes.append({"key": key, "value": draw(any_value())})
    for _ in range(draw(st.integers(0, 2))):
        attributes.append({"key": draw(TEXT), "value": draw(any_value())})
    return {
        "traceId": draw(st.sampled_from([f"{number + 1:032x}", "0" * 32, "zz", ""])),
        "spanId": f"{number + 1:016x}",
        "name": draw(TEXT),
        "startTimeUnixNano": str(
            draw(st.sampled_from([0, 1_700_000_000 * 10**9, 10**25, 2**64 - 1]))
        ),
        "attributes": attributes,
    }


def export_request(span_list: list[dict[str, Any]]) -> dict[str, Any]:
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {}, "spans": span_list}]}]}


def as_protobuf(body: dict[str, Any]) -> bytes | None:
    """The same request in protobuf (ids as bytes); None when the ids are not hex."""
    try:
        converted = json.loads(json.dumps(body))
        for resource in converted["resourceSpans"]:
            for scope in resource["scopeSpans"]:
                for span in scope["spans"]:
                    for name in ("traceId", "spanId"):
                        span[name] = base64.b64encode(bytes.fromhex(span[name])).decode()
        message = json_format.ParseDict(converted, ExportTraceServiceRequest())
    except (ValueError, json_format.ParseError):
        return None
    return message.SerializeToString()


@pytest.fixture
def otlp_client(tmp_path: Path, store_url: str, redis_url: str) -> Iterator[TestClient]:
    settings = make_settings(tmp_path, store_url, redis_url, max_commit_seconds=120.0)
    with TestClient(create_app(settings)) as client:
        yield client


def test_any_otlp_body_is_a_200_or_a_400_in_json_and_protobuf(otlp_client: TestClient) -> None:
    numbers = iter(range(10**9))

    @given(data=st.data())
    @hypothesis_settings(
        max_examples=60,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(data: st.DataObject) -> None:
        body = export_request(
            [data.draw(spans(next(numbers))) for _ in range(data.draw(st.integers(1, 3)))]
        )
        answers = [
            otlp_client.post(
                "/v1/traces",
                content=json.dumps(body),
                headers={"content-type": "application/json"},
            )
        ]
        protobuf = as_protobuf(body)
        if protobuf is not None:
            answers.append(
                otlp_client.post(
                    "/v1/traces",
                    content=protobuf,
                    headers={"content-type": "application/x-protobuf"},
                )
            )
        for answer in answers:
            assert answer.status_code in (200, 400), (answer.status_code, answer.content[:300])

    check()
    assert otlp_client.get("/ui/events").status_code == 200
    assert otlp_client.get("/metrics").status_code == 200


def test_documents_sharing_one_id_get_distinct_ids_in_one_pass() -> None:
    count = 8_000
    attributes = [
        {"key": "openinference.span.kind", "value": {"stringValue": "RETRIEVER"}},
        {"key": "input.value", "value": {"stringValue": "what"}},
    ]
    for i in range(count):
        attributes.append(
            {"key": f"retrieval.documents.{i}.document.id", "value": {"stringValue": "same"}}
        )
        attributes.append(
            {"key": f"retrieval.documents.{i}.document.content", "value": {"stringValue": f"t{i}"}}
        )
    span = {"traceId": "1" * 32, "spanId": "2" * 16, "name": "r", "attributes": attributes}
    body = json.dumps(export_request([span])).encode()
    mapped = map_request(
        decode(body, "json", SELECT, Settings().max_body_items),
        MappingConfig.from_settings(Settings()),
    )
    ids = [p["id"] for p in mapped.events[0]["passages"]]
    assert ids[:3] == ["same", "same#2", "same#3"]
    assert len(set(ids)) == count
    assert ids[-1] == f"same#{count}"
