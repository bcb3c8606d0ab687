"""Redaction covers every free text an event or its feedback carries, and its cost is linear in
the text whatever the pattern, so a hostile text cannot stall the API.

Tests ``service.contract.redaction``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.api.app import create_app
from service.contract.redaction import Redactor
from service.store.engine import session_scope
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.helpers import make_event

EMAIL = "jane.doe@example.com"


def best_time(redactor: Redactor, sample: str) -> float:
    timings = []
    for _ in range(3):
        started = time.perf_counter()
        redactor.redact(sample)
        timings.append(time.perf_counter() - started)
    return min(timings)


def test_the_email_pattern_is_linear_on_text_without_an_at_sign() -> None:
    # A backtracking engine retries the local part from every start: quadratic, minutes at 4 MB.
    redactor = Redactor.from_settings(["email", "phone", "api_key", r"re:(a+)+b"])
    one = best_time(redactor, "a" * 1_000_000)
    four = best_time(redactor, "a" * 4_000_000)
    assert four < 1.0, f"4 MB took {four:.2f}s"
    assert four < 8 * one + 0.05, f"1 MB {one:.3f}s, 4 MB {four:.3f}s: not linear"


def test_a_pattern_without_a_linear_engine_is_refused_at_startup() -> None:
    with pytest.raises(ValueError, match="not valid RE2 syntax"):
        Redactor.from_settings([r"re:(?<=x)secret"])


def test_every_free_text_is_redacted_before_storage(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = make_settings(tmp_path, store_url, redis_url, redact=["email"])
    event = make_event("pii", app=f"app {EMAIL}", retriever=f"r {EMAIL}", environment=EMAIL)
    event["passages"][0]["id"] = EMAIL
    event["gold_passage_ids"] = [EMAIL]
    event["candidates"] = [{"id": EMAIL}]
    event["response"] = f"wrote to {EMAIL}"
    event["metadata"] = {EMAIL: [EMAIL, {"user": EMAIL}]}
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events", json=event).status_code == 202
        feedback = {"response": f"mail {EMAIL}", "response_grade": 4}
        assert client.post("/v1/events/pii/feedback", json=feedback).status_code == 200
        stored = client.get("/v1/events/pii").json()
    assert stored["passages"][0]["id"] == "[redacted:email]"
    assert stored["gold_passage_ids"] == ["[redacted:email]"]
    assert stored["passages"][0]["gold"] is True  # the id and the gold id are masked alike
    runtime = Runtime(settings)
    with session_scope(runtime.engine) as session:
        rows = [
            repr(tuple(row))
            for table in ("events", "passages")
            for row in session.execute(text(f"SELECT * FROM {table}"))
        ]
    runtime.engine.dispose()
    everything = "\n".join(rows)
    assert "[redacted:email]" in everything
    assert EMAIL not in everything


def test_healthz_answers_while_megabytes_are_redacted(tmp_path: Path, redis_url: str) -> None:
    from service.store.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'rm.db'}"
    upgrade(url)
    settings = make_settings(
        tmp_path, url, redis_url, redact=["email", "phone"], max_passage_chars=5_000_000
    )
    event = make_event("big", n=1)
    event["passages"][0]["text"] = "a" * 4_000_000  # no "@": the worst case for the email pattern
    with TestClient(create_app(settings)) as client:
        outcome: list[int] = []
        sender = threading.Thread(
            target=lambda: outcome.append(client.post("/v1/events", json=event).status_code)
        )
        sender.start()
        health = []
        while sender.is_alive():
            health.append(client.get("/healthz").status_code)
        sender.join()
        health.append(client.get("/healthz").status_code)
    assert outcome == [202]
    assert set(health) == {200}
