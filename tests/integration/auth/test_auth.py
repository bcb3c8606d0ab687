"""API keys and tenants: the tenant comes from the key, reads are scoped to it.

Tests ``service.auth.keys``, ``service.auth.callers``, ``service.http.deps``, ``service.cli.keys``
and ``service.cli.__main__``.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from service.api.app import create_app
from service.auth.keys import CACHE_SECONDS, key_hash
from service.config.settings import Settings
from service.store.migrate import upgrade
from tests.support.environment import make_settings, settings_env
from tests.support.helpers import bearer, make_event
from tests.support.paths import REPO_ROOT


def create_key(settings: Settings, tenant: str, *extra: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "service.cli", "keys", "create", "--tenant", tenant, *extra],
        env=settings_env(settings),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    key = result.stdout.strip()
    assert key.startswith("rm_")
    return key


@pytest.fixture
def auth_settings(tmp_path: Path, sqlite_url: str, redis_url: str) -> Settings:
    upgrade(sqlite_url)
    return make_settings(tmp_path, sqlite_url, redis_url, auth_required=True, metrics_auth=True)


@pytest.fixture
def auth_client(auth_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(auth_settings)) as client:
        yield client


def test_keys_are_stored_only_as_hashes(auth_settings: Settings) -> None:
    key = create_key(auth_settings, "acme")
    engine = create_engine(auth_settings.database_url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT tenant, key_hash FROM api_keys")).all()
    engine.dispose()
    assert rows == [("acme", key_hash(key))]
    assert key not in str(rows)


def test_no_key_and_wrong_key_are_401(auth_client: TestClient, auth_settings: Settings) -> None:
    create_key(auth_settings, "acme")
    response = auth_client.post("/v1/events", json=make_event("e1"))
    assert response.status_code == 401
    assert "API key is required" in response.json()["detail"]
    response = auth_client.post("/v1/events", json=make_event("e1"), headers=bearer("rm_nope"))
    assert response.status_code == 401
    assert "unknown or revoked" in response.json()["detail"]
    assert auth_client.get("/healthz").status_code == 200  # health stays open


def test_the_tenant_comes_from_the_key_and_reads_are_scoped(
    auth_client: TestClient, auth_settings: Settings
) -> None:
    acme, globex = create_key(auth_settings, "acme"), create_key(auth_settings, "globex")
    assert (
        auth_client.post("/v1/events", json=make_event("e1"), headers=bearer(acme)).status_code
        == 202
    )
    # The same event_id is free for another tenant, and each sees only its own.
    other = make_event("e1", query="globex question")
    assert (
        auth_client.post("/v1/events", json=other, headers={"X-API-Key": globex}).status_code == 202
    )
    assert (
        auth_client.get("/v1/events/e1", headers=bearer(acme)).json()["query"]
        == make_event()["query"]
    )
    assert (
        auth_client.get("/v1/events/e1", headers=bearer(globex)).json()["query"]
        == "globex question"
    )
    assert (
        auth_client.post("/v1/events", json=make_event("e2"), headers=bearer(acme)).status_code
        == 202
    )
    assert auth_client.get("/v1/events/e2", headers=bearer(globex)).status_code == 404
    assert (
        auth_client.post(
            "/v1/events/e2/feedback", json={"response_grade": 3}, headers=bearer(globex)
        ).status_code
        == 404
    )


def test_revoked_keys_stop_working(
    auth_client: TestClient, auth_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = create_key(auth_settings, "acme")
    assert auth_client.get("/v1/events/x", headers=bearer(key)).status_code == 404
    subprocess.run(
        [sys.executable, "-m", "service.cli", "keys", "revoke", key_hash(key)[:12]],
        env=settings_env(auth_settings),
        cwd=REPO_ROOT,
        check=True,
        capture_output=True,
    )
    # Within the cache lifetime the key may still pass; after it, it must not.
    import time

    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + CACHE_SECONDS + 1)
    assert auth_client.get("/v1/events/x", headers=bearer(key)).status_code == 401


def test_metrics_need_an_admin_key_when_protected(
    auth_client: TestClient, auth_settings: Settings
) -> None:
    tenant_key = create_key(auth_settings, "acme")
    admin_key = create_key(auth_settings, "ops", "--admin")
    assert auth_client.get("/metrics").status_code == 401
    assert auth_client.get("/metrics", headers=bearer(tenant_key)).status_code == 401
    response = auth_client.get("/metrics", headers=bearer(admin_key))
    assert response.status_code == 200
    assert "retrieval_monitor_events_accepted_total" in response.text
