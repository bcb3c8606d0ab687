"""A page on another site cannot change anything, through any route: every state-changing route
of the application (read from ``app.routes``) refuses a browser's cross-site request with a 403
and changes nothing, and still serves its own pages and clients that are not browsers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select

from service.api.app import create_app
from service.config.settings import Settings
from service.store.migrate import upgrade
from service.store.partitions import schema_tables
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.routes import RouteAddress, state_changing_routes

PROBE_EVENT = "cross-site-probe"
ELSEWHERE = "https://elsewhere.example"
# The headers browsers send on a request another site started, from the newest to the oldest
# browsers (which send an Origin only) and a sandboxed frame (whose Origin is "null").
CROSS_SITE_HEADERS = [
    {"Origin": ELSEWHERE, "Sec-Fetch-Site": "cross-site"},
    {"Origin": ELSEWHERE},
    {"Sec-Fetch-Site": "cross-site"},
    {"Origin": "null"},
]
# A body-less form POST: what an auto-submitted <form> on another site sends.
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


def _table_rows(settings: Settings) -> dict[str, int]:
    engine = create_engine(settings.database_url)
    try:
        with engine.connect() as conn:
            return {
                table.name: int(conn.execute(select(func.count()).select_from(table)).scalar_one())
                for table in schema_tables(engine.dialect.name)
            }
    finally:
        engine.dispose()


@pytest.fixture
def open_settings(tmp_path: Path, sqlite_url: str, redis_url: str) -> Settings:
    """API keys off, the embedded default: a cross-site request needs no credential at all."""
    upgrade(sqlite_url)
    return make_settings(tmp_path, sqlite_url, redis_url)


@pytest.fixture
def app(open_settings: Settings) -> FastAPI:
    return create_app(open_settings)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, base_url="http://testserver") as test_client:
        event = make_event(PROBE_EVENT, gold_passage_ids=["d1"])
        stored = test_client.post("/v1/events", json=event)
        assert stored.status_code == 202, stored.text
        yield test_client


def _send(client: TestClient, route: RouteAddress, headers: dict[str, str]) -> tuple[int, str]:
    answer = client.request(
        route.method,
        route.url(event_id=PROBE_EVENT),
        content=b"",
        headers={**FORM, **headers},
        follow_redirects=False,
    )
    return answer.status_code, answer.text


def test_the_application_has_state_changing_routes(app: FastAPI) -> None:
    # The walk below is only worth something when it finds the routes; these must be among them.
    routes = set(state_changing_routes(app))
    assert RouteAddress("POST", "/v1/calibration/local-judge") in routes
    assert RouteAddress("POST", "/ui/login") in routes
    assert RouteAddress("PUT", "/v1/events/{event_id}/miss-cause") in routes


@pytest.mark.parametrize(
    "headers",
    CROSS_SITE_HEADERS,
    ids=["fetch-site-and-origin", "origin", "fetch-site", "null-origin"],
)
def test_every_state_changing_route_refuses_a_cross_site_request(
    app: FastAPI, client: TestClient, open_settings: Settings, headers: dict[str, str]
) -> None:
    before = _table_rows(open_settings)
    answered = {}
    for route in state_changing_routes(app):
        status, text = _send(client, route, headers)
        answered[f"{route.method} {route.path}"] = (status, "cross-site request refused" in text)
    accepted = {route: result for route, result in answered.items() if result != (403, True)}
    assert not accepted, f"answered a cross-site write: {accepted}"
    assert _table_rows(open_settings) == before


@pytest.mark.parametrize(
    "headers",
    [
        {},  # a client that is not a browser
        {"Origin": "http://testserver", "Sec-Fetch-Site": "same-origin"},
        {"Origin": "http://testserver"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "none"},  # typed in by the user
        # A key in a header: another site's page can only send one after a CORS preflight.
        {"Origin": ELSEWHERE, "Sec-Fetch-Site": "cross-site", "Authorization": "Bearer any"},
        {"Origin": ELSEWHERE, "Sec-Fetch-Site": "cross-site", "X-API-Key": "any"},
    ],
    ids=["no-browser", "same-origin", "own-origin", "same-site", "typed", "bearer", "x-api-key"],
)
def test_own_pages_and_other_clients_are_not_refused(
    app: FastAPI, client: TestClient, headers: dict[str, str]
) -> None:
    for route in state_changing_routes(app):
        status, text = _send(client, route, headers)
        assert "cross-site request refused" not in text, (route, status, text)


def test_a_reading_request_from_elsewhere_is_answered(client: TestClient) -> None:
    cross = CROSS_SITE_HEADERS[0]
    assert client.get(f"/v1/events/{PROBE_EVENT}", headers=cross).status_code == 200
    assert client.head("/healthz", headers=cross).status_code in (200, 405)


def test_with_keys_on_a_cross_site_request_is_refused_before_the_key_check(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url, auth_required=True)
    with TestClient(create_app(settings)) as client:
        answer = client.post(
            "/v1/calibration/local-judge", headers={**FORM, **CROSS_SITE_HEADERS[0]}
        )
    assert answer.status_code == 403
    assert "cross-site request refused" in answer.json()["detail"]
