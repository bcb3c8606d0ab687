"""Small hostile inputs: LIKE wildcards in a revoke, booleans as numbers, and how fast a
revocation reaches a process that cached the key.

Tests ``service.analysis.window``, ``service.process.exposure`` and ``service.store.keys``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlmodel import col

from service.api.app import create_app
from service.auth.keys import (
    CACHE_SECONDS,
    EPOCH_CHECK_SECONDS,
    KeyStore,
    announce_revocation,
    key_hash,
    new_key,
)
from service.config.settings import Settings
from service.primitives.clock import utcnow
from service.process.exposure import open_remote_refusal
from service.store import keys as keys_repository
from service.store.engine import make_engine, session_scope
from service.store.models import ApiKey
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.paths import REPO_ROOT


def test_wildcards_in_a_revoke_prefix_are_characters(store_url: str) -> None:
    engine = make_engine(store_url)
    with session_scope(engine) as session:
        for tenant in ("acme", "globex"):
            keys_repository.add_key(session, tenant, key_hash(new_key()), "", False, utcnow())
        session.commit()
        assert keys_repository.revoke_keys(session, "%%%%%%%%", utcnow()) == 0
        assert keys_repository.revoke_keys(session, "________", utcnow()) == 0
        session.commit()
        revoked = session.execute(
            select(col(ApiKey.revoked_at)).where(col(ApiKey.revoked_at).is_not(None))
        ).all()
        assert revoked == []
    engine.dispose()


def test_booleans_are_not_numbers(tmp_path: Path, sqlite_url: str, redis_url: str) -> None:
    from service.store.migrate import upgrade

    upgrade(sqlite_url)
    settings = make_settings(tmp_path, sqlite_url, redis_url)
    with TestClient(create_app(settings)) as client:
        answer = client.post("/v1/events", json={**make_event("b1"), "k": True})
        assert answer.status_code == 422
        assert "k" in answer.json()["detail"]
        assert client.post("/v1/events", json=make_event("b2", k=2)).status_code == 202
        graded = client.post("/v1/events/b2/feedback", json={"response_grade": True})
        assert graded.status_code == 422


def test_a_revocation_reaches_a_process_that_cached_the_key(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = make_settings(tmp_path, store_url, redis_url)
    runtime = Runtime(settings)
    key = new_key()
    with session_scope(runtime.engine) as session:
        keys_repository.add_key(session, "acme", key_hash(key), "", False, utcnow())
        session.commit()
    replica = KeyStore(runtime.engine, runtime.redis)
    assert replica.principal(key) is not None  # cached for the next 30 s
    with session_scope(runtime.engine) as session:
        assert keys_repository.revoke_keys(session, key_hash(key)[:12], utcnow()) == 1
        session.commit()
    announce_revocation(runtime.redis)
    # Well within the lookup cache's 30 s: the epoch is read at most every EPOCH_CHECK_SECONDS.
    deadline = time.monotonic() + 3 * EPOCH_CHECK_SECONDS
    while replica.principal(key) is not None:
        assert time.monotonic() < deadline, "the revocation did not reach the cached lookup"
        time.sleep(0.05)
    assert CACHE_SECONDS > 3 * EPOCH_CHECK_SECONDS


@pytest.mark.parametrize(
    ("path", "query"),
    [
        ("/v1/analysis", {"since": "999999999999999999999d"}),
        ("/v1/analysis", {"since": "1e300w"}),
        ("/v1/analysis", {"since": "0001-01-01T00:00:00Z"}),
        ("/v1/analysis", {"since": "2020-01-01", "until": "9999-12-31T23:59:59"}),
        ("/v1/analysis/compare", {"since": "0001-01-01T00:00:00+14:00"}),
        ("/v1/analysis/compare", {"baseline_since": "0001-01-02", "baseline_until": "2020-01-01"}),
    ],
)
def test_windows_outside_the_calendar_are_422(
    tmp_path: Path, store_url: str, redis_url: str, path: str, query: dict[str, str]
) -> None:
    settings = make_settings(tmp_path, store_url, redis_url)
    with TestClient(create_app(settings)) as client:
        answer = client.get(path, params=query)
        assert answer.status_code == 422, answer.text
        assert answer.json()["detail"]
        # An ordinary window still answers.
        assert client.get(path, params={"since": "7d"}).status_code == 200


def test_serve_refuses_to_listen_beyond_loopback_without_keys(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RM_")}
    env.update(
        {
            "RM_DATA_DIR": str(tmp_path / "var"),
            "RM_DATABASE_URL": f"sqlite:///{tmp_path / 'rm.db'}",
            "PYTHONPATH": str(REPO_ROOT),
        }
    )
    command = [sys.executable, "-m", "service.cli", "serve", "--host", "0.0.0.0", "--no-worker"]
    refused = subprocess.run(
        command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 2
    assert "RM_AUTH_REQUIRED=true" in refused.stderr
    assert "RM_ALLOW_OPEN_REMOTE=true" in refused.stderr
    # Nothing was started on the way to the refusal.
    assert not (tmp_path / "var" / "redis").exists()


@pytest.mark.parametrize(
    ("host", "extra", "refused"),
    [
        ("127.0.0.1", {}, False),
        ("::1", {}, False),
        ("localhost", {}, False),
        ("0.0.0.0", {}, True),
        ("10.1.2.3", {}, True),
        ("0.0.0.0", {"auth_required": True}, False),
        ("0.0.0.0", {"allow_open_remote": True}, False),
    ],
)
def test_which_listen_addresses_need_keys(host: str, extra: dict[str, bool], refused: bool) -> None:
    settings = Settings.model_validate({"host": host, **extra})
    assert (open_remote_refusal(settings) is not None) is refused
