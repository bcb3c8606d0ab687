"""Real OTLP/HTTP bodies, as offline RAG clients posted them, through the receiver.

The captures (``../shared/data/otlp_captures``) come from LangChain and LlamaIndex instrumented
with OpenInference and from LlamaIndex instrumented with Traceloop's OpenLLMetry, each exported
with the OpenTelemetry SDK's OTLP/HTTP exporter. Each body is posted as recorded; its decoded view
(base64 ids) is posted again as OTLP/JSON (hex ids) and must map to the very same events.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse

from service.config.settings import Settings
from tests.support.metrics_reading import metric_value
from tests.support.otlp_bodies import hex_ids, otlp_app
from tests.support.paths import shared_data_dir

pytestmark = pytest.mark.shared_data

CAPTURES = shared_data_dir() / "otlp_captures"

# What each capture must give: per event, its source file, query, app, retriever and passages.
EXPECTED: dict[str, list[dict[str, Any]]] = {
    "openinference_langchain": [
        {
            "file": "000_v1_traces.pb",
            "query": "dielectric constant of liquids microwave",
            "app": "rag-client-lc",
            "retriever": "bm25",  # metadata.ls_retriever_name
            # ids from output.value (the Documents' ids), scores from the documents' metadata
            "passages": [
                ("4", 4.019529925201299),
                ("2", 0.24999145617035132),
                ("3", 0.19236662770413482),
            ],
        },
        {
            "file": "001_v1_traces.pb",
            "query": "electronic computer",
            "app": "rag-client-lc",
            "retriever": "vectorstore",
            "passages": [("4", None), ("1", None)],
        },
    ],
    "openinference_llama_index": [
        {
            "file": "001_v1_traces.pb",
            "query": "dielectric constant of liquids",
            "app": "rag-client-li",
            "retriever": "ToyRetriever",
            "passages": [("4", 1.0), ("2", 0.25)],
        },
        {
            "file": "003_v1_traces.pb",
            "query": "electronic computer linear equations",
            "app": "rag-client-li",
            "retriever": "ToyRetriever",
            "passages": [("2", 1.0), ("4", 0.0)],
        },
    ],
    "traceloop_llama_index": [
        {
            "file": "000_v1_traces.pb",
            "query": "dielectric constant of liquids",
            "app": "rag-client-traceloop",
            "retriever": "ToyRetriever",
            "passages": [("4", 1.0), ("2", 0.25)],
        },
    ],
}


def capture_dir(name: str) -> Path:
    folder = CAPTURES / name
    if not folder.is_dir():
        pytest.skip(f"no OTLP captures at {folder} (set RM_SHARED_DATA to the shared data folder)")
    return folder


def recorded_content_type(body_path: Path) -> str:
    headers = body_path.with_name(body_path.name.split("_", 1)[0] + ".headers.txt")
    for line in headers.read_text().splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-type":
            return value.strip()
    raise AssertionError(f"no content-type in {headers}")


def otlp_json_from_decoded_view(body_path: Path) -> bytes:
    view = body_path.with_name(body_path.name.replace(".pb", ".decoded.json"))
    document = json.loads(view.read_text())
    hex_ids(document)
    return json.dumps(document).encode()


@pytest.fixture
def capture_client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(otlp_app(settings)) as client:
        yield client


def stored_events(client: TestClient, event_ids: list[str]) -> dict[str, dict[str, Any]]:
    return {event_id: client.get(f"/v1/events/{event_id}").json() for event_id in event_ids}


@pytest.mark.parametrize("capture", sorted(EXPECTED))
def test_each_capture_gives_one_event_per_retrieval(
    capture_client: TestClient, capture: str
) -> None:
    folder = capture_dir(capture)
    bodies = sorted(folder.glob("*.pb"))
    assert bodies, f"no .pb files in {folder}"
    producing: list[str] = []
    for body_path in bodies:
        before = metric_value(capture_client, "retrieval_monitor_events_accepted_total")
        response = capture_client.post(
            "/v1/traces",
            content=body_path.read_bytes(),
            headers={"content-type": recorded_content_type(body_path)},
        )
        assert response.status_code == 200, response.content
        answer = ExportTraceServiceResponse.FromString(response.content)
        assert not answer.HasField("partial_success"), answer.partial_success.error_message
        after = metric_value(capture_client, "retrieval_monitor_events_accepted_total")
        assert after - before in (0, 1)
        if after > before:
            producing.append(body_path.name)

    expected = EXPECTED[capture]
    assert producing == [e["file"] for e in expected]

    # Find the stored events through their ids, which derive from the trace and span ids.
    from service.ingest.otlp.decode import decode
    from service.ingest.otlp.mapping import SELECT, event_id_for

    for want in expected:
        spans = decode(
            (folder / want["file"]).read_bytes(), "protobuf", SELECT, Settings().max_body_items
        ).spans
        (event_id,) = [event_id_for(span) for span in spans]
        stored = capture_client.get(f"/v1/events/{event_id}").json()
        assert stored["status"] == "pending"
        assert stored["query"] == want["query"]
        assert (stored["app"], stored["retriever"]) == (want["app"], want["retriever"])
        assert [p["id"] for p in stored["passages"]] == [pid for pid, _ in want["passages"]]
        assert stored["k"] == len(want["passages"])

    # The same spans again, as OTLP/JSON: the very same events, so every one is a duplicate.
    accepted = metric_value(capture_client, "retrieval_monitor_events_accepted_total")
    for body_path in bodies:
        response = capture_client.post(
            "/v1/traces",
            content=otlp_json_from_decoded_view(body_path),
            headers={"content-type": "application/json"},
        )
        assert response.status_code == 200
        assert response.json() == {}
    assert metric_value(capture_client, "retrieval_monitor_events_accepted_total") == accepted
    assert metric_value(capture_client, "retrieval_monitor_events_duplicate_total") == len(expected)
    assert metric_value(capture_client, "retrieval_monitor_events_rejected_total") == 0


def test_capture_scores_survive(capture_client: TestClient) -> None:
    """Scores reach the stored passages (the API shows ranks and ids; the database the rest)."""
    from sqlalchemy import create_engine, text

    folder = capture_dir("openinference_langchain")
    body = (folder / "000_v1_traces.pb").read_bytes()
    assert (
        capture_client.post(
            "/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
        ).status_code
        == 200
    )
    settings: Settings = capture_client.app.state.rm.runtime.settings  # type: ignore[attr-defined]
    engine = create_engine(settings.database_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT passage_id, score FROM passages ORDER BY rank")).all()
    engine.dispose()
    assert [(r[0], r[1]) for r in rows] == EXPECTED["openinference_langchain"][0]["passages"]
