"""Sensitive text: masked before storage, logs and the judge; erased after judging or after the
retention period, with the scores kept."""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.contract.redaction import Redactor
from service.process import logs
from service.store.migrate import upgrade
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event
from tests.support.live import WorkerFactory, wait_status

EMAIL, PHONE, KEY = "jane.doe@example.com", "+1 415-555-0199", "sk-live_abcdefghijklmnop1234"


def test_built_in_patterns() -> None:
    redactor = Redactor.from_settings(["email", "phone", "api_key"])
    text = f"mail {EMAIL} or call {PHONE}, key {KEY}; in 2024 we sold 1200 units"
    assert redactor.redact(text) == (
        "mail [redacted:email] or call [redacted:phone], key [redacted:api_key]; "
        "in 2024 we sold 1200 units"
    )
    custom = Redactor.from_settings([r"re:ACCT-\d{6}"])
    assert custom.redact("account ACCT-123456 closed") == "account [redacted:custom0] closed"
    with pytest.raises(ValueError, match="unknown redaction pattern"):
        Redactor.from_settings(["passport"])


def all_database_text(path: Path) -> str:
    connection = sqlite3.connect(path)
    chunks = []
    for (table,) in connection.execute("SELECT name FROM sqlite_master WHERE type='table'"):
        for row in connection.execute(f'SELECT * FROM "{table}"'):
            chunks.append(repr(row))
    connection.close()
    return "\n".join(chunks)


@pytest.fixture
def service_logging() -> Iterator[None]:
    """The root logger as the service's own logging leaves it, restored after the test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_seeded_pii_never_reaches_the_database_logs_or_judge(
    tmp_path: Path,
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
    capfd: pytest.CaptureFixture[str],
    service_logging: None,
) -> None:
    db = tmp_path / "rm.db"
    upgrade(f"sqlite:///{db}")
    settings = make_settings(
        tmp_path,
        f"sqlite:///{db}",
        redis_url,
        judge_base_url=fake_llm.base_url,
        redact=["email", "phone", "api_key"],
        passage_text_storage="hash_after_judging",
    )
    # The API's records go where `retrieval-monitor serve` sends them: stderr, which capfd reads.
    logs.configure(settings.log_level, settings.log_json)
    worker = worker_factory(settings).start()
    event = make_event("pii", n=3, query=f"why was {EMAIL} charged twice")
    event["passages"][0]["text"] = f"Contact {PHONE} for refunds. Internal key {KEY}."
    event["response"] = f"We emailed {EMAIL}."
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events", json=event).status_code == 202
        stored = wait_status(client, "pii")
        assert stored["query"] == "why was [redacted:email] charged twice"
        assert stored["measures"]["precision"] is not None
    worker.stop()

    everything = all_database_text(db)
    sent_to_judge = repr(fake_llm.stats()["requests"])
    logged = worker.log_path.read_text() + "".join(capfd.readouterr())
    for secret in (EMAIL, PHONE, KEY):
        assert secret not in everything
        assert secret not in sent_to_judge
        assert secret not in logged
    assert "[redacted:phone]" in sent_to_judge

    # Positive control: a record carrying the secret, sent through the logger an ingest module
    # uses and the handler the service installed, is seen by the same capture. So the checks
    # above would catch the text if the service logged it.
    logging.getLogger("service.ingest.ingestor").info("event query: %s", event["query"])
    controlled = worker.log_path.read_text() + "".join(capfd.readouterr())
    assert EMAIL in controlled
    # hash_after_judging: no passage text is left, the hashes are.
    connection = sqlite3.connect(db)
    texts = connection.execute("SELECT count(*) FROM passage_texts").fetchone()
    references = connection.execute("SELECT text_released, content_hash FROM passages").fetchall()
    connection.close()
    assert texts == (0,)
    assert len(references) == 3
    assert all(released and len(digest) == 64 for released, digest in references)


def test_retention_purges_texts_and_keeps_scores(
    tmp_path: Path, redis_url: str, fake_llm: FakeLLM, worker_factory: WorkerFactory
) -> None:
    from celery import Celery

    db = tmp_path / "rm.db"
    upgrade(f"sqlite:///{db}")
    settings = make_settings(
        tmp_path,
        f"sqlite:///{db}",
        redis_url,
        judge_base_url=fake_llm.base_url,
        retention_days=1,
    )
    fake_llm.set_labels({(None, "passage number 1 about topic 1"): 3})
    worker_factory(settings).start()
    with TestClient(create_app(settings)) as client:
        for name in ("old", "new"):
            client.post("/v1/events", json=make_event(name, n=2, response="an answer"))
            wait_status(client, name)
        connection = sqlite3.connect(db)
        connection.execute(
            "UPDATE events SET received_at = datetime('now', '-2 days') WHERE event_id = 'old'"
        )
        connection.commit()
        connection.close()
        Celery(broker=redis_url).send_task("events.purge", queue=settings.queue_name)

        def purged() -> bool:
            return bool(client.get("/v1/events/old").json()["query"] == "")

        from tests.support.live import wait_for

        wait_for(purged, timeout=60)
        old, new = client.get("/v1/events/old").json(), client.get("/v1/events/new").json()
        assert old["measures"]["precision"] == 0.5  # the score stays
        assert new["query"] == make_event()["query"]  # within retention: untouched
    connection = sqlite3.connect(db)
    rows = connection.execute(
        "SELECT e.event_id, e.response, p.text_released FROM events e "
        "JOIN passages p ON p.event_pk = e.id"
    ).fetchall()
    stored_texts = connection.execute("SELECT count(*) FROM passage_texts").fetchone()
    connection.close()
    assert {(e, r, released) for e, r, released in rows if e == "old"} == {("old", None, 1)}
    assert not any(released for e, _r, released in rows if e == "new")
    # Both events sent the same two texts: they stay stored for the event within retention.
    assert stored_texts == (2,)
