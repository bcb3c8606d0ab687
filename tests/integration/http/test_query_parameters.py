"""Query parameters no route can take are a 422 with a message, never a 5xx (which would tell a
client to retry forever): generated from the service's own OpenAPI document for every operation
with query parameters, sent with hostile text to every route the application has (pages too),
and the cases that once answered 503, on both stores.

Tests ``service.http.query_params`` and ``service.contract.asgi_answer``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings

from service.api.app import create_app
from service.config.settings import Settings
from service.http.query_params import MAX_QUERY_TEXT_CHARS
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.routes import every_route

EXAMPLES_PER_MODE = 40
MISS_EVENT = "query-probe-miss"
# Hostile text for any query parameter, as it travels in the query string.
HOSTILE_QUERIES = {
    "nul": "app=a%00b",
    "nul-in-name": "a%00b=1",
    "not-utf-8": "app=%FF%FE",
    "lone-surrogate": "app=%ED%A0%80",  # U+D800 written as UTF-8 would write it
    "too-long": "app=" + "x" * (MAX_QUERY_TEXT_CHARS + 1),
    "too-many": "&".join(f"p{number}=1" for number in range(100)),
}


@pytest.fixture
def store_settings(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    return make_settings(tmp_path, store_url, redis_url)


@pytest.fixture
def app(store_settings: Settings) -> FastAPI:
    return create_app(store_settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        miss = make_event(MISS_EVENT, n=3, k=1, gold_passage_ids=["d3"])
        assert test_client.post("/v1/events", json=miss).status_code == 202
        yield test_client


def test_generated_query_parameters_never_answer_a_5xx(app: FastAPI, client: TestClient) -> None:
    """Every operation of the OpenAPI document that takes query parameters, with values inside
    the documented schema and outside it, on a fixed seed: no answer is a 5xx."""
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]  # type: ignore[union-attr]
    with_query = [
        operation
        for operation in operations
        if any(parameter.location == "query" for parameter in operation.iter_parameters())
    ]
    assert {f"{op.method.upper()} {op.path}" for op in with_query} >= {
        "GET /v1/analysis",
        "POST /v1/calibration/local-judge",
        "GET /v1/misses/causes",
    }
    server_errors: list[tuple[str, int, Any]] = []
    for operation in with_query:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @hypothesis_settings(
                max_examples=EXAMPLES_PER_MODE,
                derandomize=True,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case[Any]) -> None:
                answer = client.request(case.method, case.formatted_path, params=case.query or None)
                if answer.status_code >= 500:
                    name = f"{case.method} {case.path}"
                    server_errors.append((name, answer.status_code, case.query))

            check()
    assert not server_errors, f"{len(server_errors)} answers were 5xx: {server_errors[:10]}"


@pytest.mark.parametrize("query", HOSTILE_QUERIES.values(), ids=HOSTILE_QUERIES.keys())
def test_every_route_refuses_hostile_query_text(
    app: FastAPI, client: TestClient, query: str
) -> None:
    """Every route the application has, documented or not (the pages are not), refuses it with
    a 422 that says which parameter and why."""
    answered = {}
    for route in every_route(app):
        url = route.url(event_id=MISS_EVENT, name="ui.css") + "?" + query
        answer = client.request(route.method, url, follow_redirects=False)
        # A HEAD answer has no body to say why.
        said_why = route.method == "HEAD" or "query" in answer.text
        answered[f"{route.method} {route.path}"] = (answer.status_code, said_why)
    not_refused = {route: result for route, result in answered.items() if result != (422, True)}
    assert len(answered) > 20
    assert not not_refused, not_refused


# --- the cases that once answered 503 --------------------------------------------------------


def test_a_negative_seed_is_refused(client: TestClient) -> None:
    for method in ("GET", "POST"):
        answer = client.request(method, "/v1/calibration/local-judge?seed=-1")
        assert answer.status_code == 422, answer.text
        assert "seed" in answer.json()["detail"]
    too_big = client.get(f"/v1/calibration/local-judge?seed={2**32}")
    assert too_big.status_code == 422
    assert "seed" in too_big.json()["detail"]


@pytest.mark.parametrize(
    "url",
    [
        "/v1/analysis?app=a%00b",
        "/v1/analysis/compare?retriever=a%00b",
        "/v1/calibration/local-judge?app=a%00b",
        "/v1/gold/agreement?retriever=a%00b",
        "/v1/misses/causes?app=a%00b",
        "/ui/events?app=a%00b",
        "/ui/misses?retriever=a%00b",
        "/ui/label?app=a%00b",
    ],
)
def test_a_nul_in_a_filter_is_refused(client: TestClient, url: str) -> None:
    answer = client.get(url, follow_redirects=False)
    assert answer.status_code == 422, answer.text
    assert "NUL" in answer.json()["detail"]


def test_an_absurd_span_on_the_label_page_is_shown_as_an_error(client: TestClient) -> None:
    answer = client.get("/ui/label?since=99999999999999999999999999w&until=now")
    assert answer.status_code == 200, answer.text
    assert "longer than any window" in answer.text


def test_a_nul_in_a_miss_cause_note_is_refused(client: TestClient) -> None:
    answer = client.put(
        f"/v1/events/{MISS_EVENT}/miss-cause", json={"cause": "other", "note": "a\x00b"}
    )
    assert answer.status_code == 422, answer.text
    assert "NUL" in answer.json()["detail"]
    assert client.get(f"/v1/events/{MISS_EVENT}/miss-cause").status_code == 404
