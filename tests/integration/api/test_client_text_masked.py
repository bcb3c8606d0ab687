"""With RM_REDACT on, no client text reaches storage or the logs unmasked, whatever route it
came by: every route that writes (taken from the app itself) is sent PII in every free-text field
its OpenAPI schema declares, then every text, JSON and binary column of every table (taken from
the models) and the captured log records are read back.

Tests ``service.contract.client_text`` and ``service.contract.redact``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from httpx2 import Response
from sqlalchemy import JSON, Column, LargeBinary, String, Text, TypeDecorator, create_engine, select

from service.api.app import create_app
from service.store.migrate import upgrade
from service.store.partitions import schema_tables
from service.store.passage_body import decode_body
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.otlp_bodies import request_body, retriever_attributes, span_pb

EMAIL, PHONE, KEY = "jane.doe@example.com", "+1 415-555-0199", "sk-live_abcdefghijklmnop1234"
SECRETS = (EMAIL, PHONE, KEY)
PII = f"{EMAIL} {PHONE} {KEY}"  # 62 characters: fits every free-text field, ids and names too
EVENT_ID = "pii-event"

Send = Callable[[TestClient], Response]
# The test's own HTTP client logs the URLs it requests; the service's records are the others.
TEST_CLIENT_LOGGERS = ("httpx", "httpcore")


def pii_event(event_id: str) -> dict[str, Any]:
    return make_event(
        event_id,
        n=2,
        app=f"app {EMAIL}",
        retriever=f"bm25 {PHONE}",
        environment=f"env {KEY}",
        query=f"why was {PII} charged",
        passages=[{"id": f"id {PII}", "text": f"text {PII}"}, {"text": "plain text"}],
        candidates=[{"id": f"id {PII}"}],
        gold_passage_ids=[f"gold {PII}"],
        response=f"we wrote to {PII}",
        metadata={f"key {EMAIL}": [f"value {PII}"]},
    )


def send_traces(client: TestClient) -> Response:
    span = span_pb(
        "retrieve",
        retriever_attributes(f"traced {PII}", [{"id": f"doc {PII}", "content": f"doc {PII}"}]),
    )
    body = request_body(span, resource={"service.name": f"svc {EMAIL}"})
    return client.post(
        "/v1/traces", content=body, headers={"content-type": "application/x-protobuf"}
    )


# Each writing route with the request that carries PII in each of its free texts, in the order
# sent (the gold labels make the event a miss whose cause can be recorded).
SEEDED: dict[tuple[str, str], Send] = {
    ("POST", "/v1/events"): lambda c: c.post("/v1/events", json=pii_event(EVENT_ID)),
    ("POST", "/v1/events/batch"): lambda c: c.post(
        "/v1/events/batch", json={"events": [pii_event("pii-batch")]}
    ),
    ("POST", "/v1/traces"): send_traces,
    ("POST", "/v1/events/{event_id}/feedback"): lambda c: c.post(
        f"/v1/events/{EVENT_ID}/feedback", json={"response": f"later {PII}"}
    ),
    ("POST", "/v1/events/{event_id}/gold"): lambda c: c.post(
        f"/v1/events/{EVENT_ID}/gold",
        json={
            "outcome": "not_retrieved",
            "missing_passage": {"id": f"missing {PII}", "text": f"missing {PII}"},
            "labeller": f"labeller {PII}",
        },
    ),
    ("PUT", "/v1/events/{event_id}/miss-cause"): lambda c: c.put(
        f"/v1/events/{EVENT_ID}/miss-cause", json={"cause": "other", "note": f"note {PII}"}
    ),
    ("POST", "/v1/calibration/local-judge"): lambda c: c.post(
        "/v1/calibration/local-judge", params={"app": f"app {EMAIL}", "retriever": PII}
    ),
    ("POST", "/ui/login"): lambda c: c.post("/ui/login", data={"key": PII}, follow_redirects=False),
    ("POST", "/ui/label/labeller"): lambda c: c.post(
        "/ui/label/labeller", data={"name": f"name {EMAIL}"}, follow_redirects=False
    ),
}
# Routes sent no PII, and why.
NOT_SEEDED: dict[tuple[str, str], str] = {
    ("POST", "/ui/logout"): "takes no body and no parameter",
}
# A second label by another labeller: the other shape of a gold body (ids among those sent).
ANSWERED_GOLD = {"outcome": "answered", "passage_ids": [f"id {PII}"], "labeller": f"other {PHONE}"}


def writing_routes(app: FastAPI) -> set[tuple[str, str]]:
    found = set()
    for context in iter_route_contexts(app.routes):
        for method in getattr(context, "methods", None) or ():
            if method not in ("GET", "HEAD"):
                found.add((method, str(context.path)))
    return found


def free_text_properties(schema: dict[str, Any], node: Any, where: str = "") -> Iterator[str]:
    """The path of every string property of a request schema that can carry free text (no enum,
    no format, no pattern that admits no "@")."""
    if isinstance(node, dict) and "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        yield from free_text_properties(schema, schema["components"]["schemas"][name], where)
        return
    if not isinstance(node, dict):
        return
    for branch in node.get("anyOf", []) + node.get("allOf", []):
        yield from free_text_properties(schema, branch, where)
    chosen = "enum" in node or "const" in node or "format" in node  # a choice, a date-time
    admits_text = "@" in node.get("pattern", "@") or node.get("pattern") == r"\S"
    if node.get("type") == "string" and not chosen and admits_text:
        yield where
    for name, sub in node.get("properties", {}).items():
        yield from free_text_properties(schema, sub, f"{where}.{name}")
    if "items" in node:
        yield from free_text_properties(schema, node["items"], f"{where}[]")


def carries_pii(body: Any, path: str) -> bool:
    """Whether the value at ``path`` (as ``free_text_properties`` writes it) holds a secret."""
    parts = [p for p in path.replace("[]", ".[]").split(".") if p]
    values = [body]
    for part in parts:
        if part == "[]":
            values = [v for value in values if isinstance(value, list) for v in value]
        else:
            values = [value[part] for value in values if isinstance(value, dict) and part in value]
    return any(isinstance(v, str) and any(s in v for s in SECRETS) for v in values)


# JSON bodies whose texts are another schema's: their seeds above carry those texts.
OTHER_SCHEMA = {
    "/v1/events/batch": "its events are bodies of POST /v1/events",
    "/v1/traces": "OTLP spans, mapped to bodies of POST /v1/events",
}


def test_every_free_text_property_of_a_json_body_is_seeded() -> None:
    """The bodies above follow the routes' schemas: a text field added to a body and left out
    of its seed here fails this test."""
    app = create_app(make_settings(Path("/nonexistent"), "sqlite://", "redis://127.0.0.1:1/0"))
    schema = app.openapi()
    seeds: dict[str, Any] = {
        "/v1/events": pii_event(EVENT_ID),
        "/v1/events/{event_id}/feedback": {"response": PII},
        "/v1/events/{event_id}/gold": {
            "missing_passage": {"id": PII, "text": PII},
            "labeller": PII,
            "passage_ids": [PII],
        },
        "/v1/events/{event_id}/miss-cause": {"note": PII},
    }
    checked = 0
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            json_schema = content.get("application/json", {}).get("schema")
            if method == "get" or json_schema is None or path in OTHER_SCHEMA:
                continue
            assert path in seeds, f"{method.upper()} {path} takes JSON and has no seed here"
            for where in free_text_properties(schema, json_schema):
                checked += 1
                assert carries_pii(seeds[path], where), f"{path}: {where} is not seeded"
    assert checked >= 15


@pytest.fixture
def captured_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.DEBUG)
    return caplog


def holds_text(column: Column[Any]) -> bool:
    """Whether a column stores text, JSON or bytes (SQLModel's strings are a TypeDecorator)."""
    stored = column.type
    if isinstance(stored, TypeDecorator):
        stored = stored.impl_instance
    return isinstance(stored, String | Text | JSON | LargeBinary)


def columns_holding_pii(database_url: str) -> dict[str, int]:
    """Every text, JSON or binary column of every table in the models, with how many of its
    values hold a secret."""
    engine = create_engine(database_url)
    found: dict[str, int] = {}
    try:
        with engine.connect() as connection:
            for table in schema_tables(engine.dialect.name):
                for column in table.columns:
                    if not holds_text(column):
                        continue
                    for (value,) in connection.execute(select(column)):
                        text = decode_body(value) if isinstance(value, bytes) else repr(value)
                        if any(secret in text for secret in SECRETS):
                            key = f"{table.name}.{column.name}"
                            found[key] = found.get(key, 0) + 1
    finally:
        engine.dispose()
    return found


def text_columns() -> list[str]:
    return [
        f"{table.name}.{column.name}"
        for table in schema_tables("postgresql")
        for column in table.columns
        if holds_text(column)
    ]


def test_no_route_stores_or_logs_client_pii(
    tmp_path: Path, store_url: str, redis_url: str, captured_logs: pytest.LogCaptureFixture
) -> None:
    upgrade(store_url)
    settings = make_settings(tmp_path, store_url, redis_url, redact=["email", "phone", "api_key"])
    app = create_app(settings)
    routes = writing_routes(app)
    assert routes == set(SEEDED) | set(NOT_SEEDED), "a writing route with no seed or reason"
    assert {"gold_labels.missing_text", "miss_causes.note", "events.query"} <= set(text_columns())

    answers = {}
    with TestClient(app) as client:
        for route, send in SEEDED.items():
            answers[route] = send(client)
        answers[("second", "gold")] = client.post(f"/v1/events/{EVENT_ID}/gold", json=ANSWERED_GOLD)
        for route in (("POST", "/v1/events"), ("POST", "/v1/events/{event_id}/gold")):
            assert answers[route].status_code < 300, answers[route].text
        assert answers[("second", "gold")].status_code == 200, answers[("second", "gold")].text
        cause = answers[("PUT", "/v1/events/{event_id}/miss-cause")]
        assert cause.status_code == 200, cause.text
        gold = client.get(f"/v1/events/{EVENT_ID}/gold").json()
        labellers = {label["labeller_name"] for label in gold["labels"]}
        assert labellers == {
            "labeller [redacted:email] [redacted:phone] [redacted:api_key]",
            "other [redacted:phone]",
        }

    # Control: the scan sees what a route stores, so a secret there would be found.
    assert "gold_labels.labeller_name" in text_columns()
    assert columns_holding_pii(settings.database_url) == {}
    leaked = [
        f"{record.name}: {record.getMessage()}"
        for record in captured_logs.records
        if not record.name.startswith(TEST_CLIENT_LOGGERS)
        and any(secret in record.getMessage() for secret in SECRETS)
    ]
    assert leaked == []
