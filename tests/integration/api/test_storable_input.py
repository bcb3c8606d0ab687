"""Storable by construction: whatever a client sends, the answer is a 2xx or a 4xx, a refused
value costs only its own event, and everything accepted can be read back afterwards (the event,
every page, the analysis, the metrics), on SQLite and PostgreSQL.

The property tests have a fixed seed (``derandomize``) and a bounded budget, so they run in the
test command and fail the same way on every machine.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from schemathesis import checks

from service.api.app import create_app
from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.ingest.ingestor import Ingestor
from service.ingest.judge_queue import JudgeQueue
from service.store.models import Event
from service.wiring.runtime import Runtime
from tests.support.database import count_rows
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.hostile_values import (
    BUDGET,
    EXAMPLES,
    FEEDBACK,
    events,
    nested,
)
from tests.support.reads import assert_everything_reads

# --- what a hostile client sends -----------------------------------------------------------------


# --- the app under test --------------------------------------------------------------------------


def fuzz_settings(tmp_path: Path, store_url: str, redis_url: str, **extra: object) -> Settings:
    # A slow shared machine must not turn commits into backpressure 503s: that is not the
    # property under test.
    return make_settings(tmp_path, store_url, redis_url, max_commit_seconds=120.0, **extra)


@pytest.fixture
def fuzz_client(
    request: pytest.FixtureRequest, tmp_path: Path, store_url: str, redis_url: str
) -> Iterator[TestClient]:
    """The app keeping every event in full, or (indirect parameter "narrow") judging half of
    them and storing the rest as narrow rows (RM_KEEP_TEXTS=needed)."""
    policy: dict[str, object] = {"keep_texts": "all"}
    if getattr(request, "param", "all") == "narrow":
        policy = {"keep_texts": "needed", "sample_rate": 0.5, "keep_texts_share": 0.0}
    with TestClient(create_app(fuzz_settings(tmp_path, store_url, redis_url, **policy))) as client:
        yield client


def post_json(client: TestClient, path: str, body: object) -> Any:
    # json.dumps writes what a careless client would: NaN, Infinity, escaped lone surrogates.
    return client.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def assert_not_server_error(response: Any) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])


# --- the properties ------------------------------------------------------------------------------


@pytest.mark.parametrize("fuzz_client", ["all", "narrow"], indirect=True)
def test_any_event_body_is_stored_or_refused_and_everything_accepted_reads_back(
    fuzz_client: TestClient,
) -> None:
    client = fuzz_client
    accepted: set[str] = set()
    numbers = iter(range(10**9))

    @given(data=st.data())
    @BUDGET
    def check(data: st.DataObject) -> None:
        number = next(numbers)
        event = data.draw(events(number), label="event")
        if data.draw(st.booleans(), label="in a batch"):
            sibling = make_event(f"fz-sibling-{number}")
            response = post_json(client, "/v1/events/batch", {"events": [event, sibling]})
            assert_not_server_error(response)
            if response.status_code == 200:
                first, second = response.json()["results"]
                # A bad event is rejected alone: its valid neighbour is always stored.
                assert second["status"] == "accepted", response.json()
                accepted.add(sibling["event_id"])
                if first["status"] == "accepted":
                    accepted.add(event["event_id"])
        else:
            response = post_json(client, "/v1/events", event)
            assert_not_server_error(response)
            if response.status_code == 202:
                accepted.add(event["event_id"])
        if event["event_id"] in accepted:
            feedback = data.draw(FEEDBACK, label="feedback")
            answer = post_json(client, f"/v1/events/{event['event_id']}/feedback", feedback)
            assert_not_server_error(answer)

    check()
    assert len(accepted) >= EXAMPLES // 4, "the strategy should produce valid events too"
    assert_everything_reads(client, accepted)
    if client.app.state.rm.runtime.settings.keep_texts == "needed":  # type: ignore[attr-defined]
        kept = {client.get(f"/v1/events/{event_id}").json()["texts_kept"] for event_id in accepted}
        assert kept == {True, False}, "both narrow and kept events were read back"


def test_the_openapi_operations_chained_by_their_links_never_fail(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    """Schemathesis walks the documented links (post an event, then read it and send its
    feedback) with generated data: only 2xx and 4xx, and every read still answers 200 after."""
    application = create_app(fuzz_settings(tmp_path, store_url, redis_url))
    with TestClient(application) as client:
        schema = schemathesis.openapi.from_asgi("/openapi.json", application)

        sound = (make_event(f"sm-{number}") for number in range(10**9))

        @schema.hook
        def map_body(context: Any, body: Any) -> Any:
            # Rules across fields (k within the passages, unique passage ids) are not in the
            # schema, and random events are almost never valid: generated events are repaired,
            # and each batch carries one sound event beside its generated ones, so the links
            # from accepted events to their reads and feedback are walked.
            operation = context.operation
            if operation is None or not isinstance(body, dict):
                return body
            if operation.path == "/v1/events":
                return repaired_event(body)
            if operation.path == "/v1/events/batch" and isinstance(body.get("events"), list):
                return {**body, "events": [*body["events"], next(sound)]}
            return body

        machine = schema.as_state_machine()

        class NoServerErrors(machine):  # type: ignore[misc,valid-type]
            def validate_response(self, response: Any, case: Any, **kwargs: Any) -> None:
                # Only the status: what a body may hold is the other tests' business.
                case.validate_response(
                    response, checks=[checks.not_a_server_error], transport_kwargs=kwargs
                )

        NoServerErrors.run(
            settings=hypothesis_settings(
                max_examples=30,
                stateful_step_count=6,
                derandomize=True,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
        )
        stored = {
            row
            for row in _stored_event_ids(client)
            if client.get(f"/v1/events/{row}").status_code != 404
        }
        assert stored, "the links start from accepted events; none was accepted"
        assert_everything_reads(client, stored)


def repaired_event(body: dict[str, Any]) -> dict[str, Any]:
    repaired = dict(body)
    passages = repaired.get("passages")
    if isinstance(passages, list) and passages:
        repaired["passages"] = [
            {**p, "id": f"d{rank}"} if isinstance(p, dict) and "id" in p else p
            for rank, p in enumerate(passages)
        ]
        if isinstance(repaired.get("k"), int) and not isinstance(repaired["k"], bool):
            repaired["k"] = max(1, min(repaired["k"], len(passages)))
    return repaired


def _stored_event_ids(client: TestClient) -> list[str]:
    from sqlalchemy import select
    from sqlmodel import col

    from service.store.engine import session_scope

    runtime = client.app.state.rm.runtime  # type: ignore[attr-defined]
    with session_scope(runtime.engine) as session:
        return [row[0] for row in session.execute(select(col(Event.event_id)).limit(200))]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("gold_passage_ids", ["ok", "bad\x00"], "gold_passage_ids[1] contains a NUL character"),
        ("gold_passage_ids", ["\ud800"], "gold_passage_ids[0] is not valid Unicode"),
        ("response", "a\x00b", "response contains a NUL character"),
        ("metadata", {"k\x00": 1}, "contains a NUL character"),
        ("metadata", {"k": ["\udfff"]}, "metadata.k[0] is not valid Unicode"),
        ("metadata", {"n": 2**80}, "metadata.n is an integer outside 64 bits"),
        ("metadata", {"n": nested(40)}, "nested more than 32 levels"),
        (
            "metadata",
            {"n": nested(9)},
            "metadata nested too deep: 10 levels > max_metadata_depth 8",
        ),
        ("timestamp", "2026-11-30T10:00:00", "timestamp has no timezone"),
        ("timestamp", "0001-01-01T00:00:00+14:00", "timestamp must be from 1970-01-01"),
        ("timestamp", "9999-12-31T23:59:59-14:00", "timestamp must be from 1970-01-01"),
        ("environment", "e" * 101, "at most 100 characters"),
        ("response", "r" * 32_001, "response too long: 32001 characters > max_response_chars"),
        (
            "gold_passage_ids",
            [f"g{i}" for i in range(1_001)],
            "too many gold_passage_ids: 1001 > max_gold_ids",
        ),
        ("gold_passage_ids", ["g" * 201], "at most 200 characters"),
        ("candidates", [{"id": f"c{i}"} for i in range(2_001)], "> max_candidates 2000"),
    ],
)
def test_values_no_store_keeps_and_values_past_a_bound_are_422_naming_them(
    fuzz_client: TestClient, field: str, value: object, message: str
) -> None:
    event = {**make_event("bad"), field: value}
    response = post_json(fuzz_client, "/v1/events", event)
    assert response.status_code == 422, response.text
    assert message in response.json()["detail"]
    batch = post_json(fuzz_client, "/v1/events/batch", {"events": [event, make_event("good")]})
    assert [r["status"] for r in batch.json()["results"]] == ["rejected", "accepted"]
    assert message in batch.json()["results"][0]["error"]
    assert_everything_reads(fuzz_client, {"good"})


def test_feedback_is_checked_like_events(fuzz_client: TestClient) -> None:
    assert post_json(fuzz_client, "/v1/events", make_event("fb")).status_code == 202
    for body, message in [
        ({"response": "x\x00"}, "response contains a NUL character"),
        ({"response": "\ud800"}, "response is not valid Unicode"),
        ({"response": "r" * 32_001}, "max_response_chars 32000"),
    ]:
        response = post_json(fuzz_client, "/v1/events/fb/feedback", body)
        assert response.status_code == 422, response.text
        assert message in response.json()["detail"]
    assert_everything_reads(fuzz_client, {"fb"})


def test_ids_no_store_holds_in_a_path_name_no_event(fuzz_client: TestClient) -> None:
    for event_id in ("a%00b", "%ED%A0%80"):
        assert fuzz_client.get(f"/v1/events/{event_id}").status_code == 404
        response = post_json(fuzz_client, f"/v1/events/{event_id}/feedback", {"response_grade": 3})
        assert response.status_code == 404
        assert fuzz_client.get(f"/ui/events/{event_id}").status_code == 404


def test_a_value_the_database_refuses_fails_its_own_event_only(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    """The safety net behind the checks: an event that slipped past them (built here without
    validation) and that the database refuses is rejected alone, the rest of its batch stored."""
    settings = fuzz_settings(tmp_path, store_url, redis_url)
    runtime = Runtime(settings)
    sender = JudgeQueue(settings.redis_url, settings.queue_name, settings.judge_slice_events)
    good = [EventIn.model_validate(make_event(f"ok-{i}")) for i in range(2)]
    valid = EventIn.model_validate(make_event("refused"))
    # A lone surrogate: neither SQLite's nor PostgreSQL's driver can encode it.
    bad_passage = valid.passages[0].model_copy(update={"text": "lone \ud800 surrogate"})
    refused = valid.model_copy(update={"passages": [bad_passage, *valid.passages[1:]]})
    results = Ingestor(runtime, sender).ingest("default", [good[0], refused, good[1]])
    assert [(r.event_id, r.status) for r in results] == [
        ("ok-0", "accepted"),
        ("refused", "rejected"),
        ("ok-1", "accepted"),
    ]
    assert (results[1].error or "").startswith("the database refused the event")
    assert count_rows(settings, Event) == 2
    runtime.engine.dispose()
