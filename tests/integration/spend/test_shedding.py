"""Shedding a backlog: the oldest normal events go, gold and urgent ones stay, all counted.

Tests ``service.store.spend``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session, select

from service.api.app import create_app
from service.config.settings import Settings
from service.spend.shedding import shed_backlog
from service.store.models import Event
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event, make_key
from tests.support.live import WorkerFactory, wait_for

REPEAT = "the same words said twice over in one list of passages for the prompt"


def backlog(client: TestClient) -> list[str]:
    """12 normal events (oldest first), 2 gold, 1 urgent (its passages repeat each other)."""
    ids = []
    for i in range(12):
        event = make_event(f"old-{i:02d}", n=3, query=f"question {i}")
        assert client.post("/v1/events", json=event).status_code == 202
        ids.append(event["event_id"])
    for i in range(2):
        gold = make_event(f"gold-{i}", n=3, query=f"gold {i}", gold_passage_ids=["d1"])
        assert client.post("/v1/events", json=gold).status_code == 202
    urgent = make_event("urgent", n=2, query="urgent")
    urgent["passages"] = [{"text": REPEAT}, {"text": REPEAT + "."}]
    assert client.post("/v1/events", json=urgent).status_code == 202
    return ids


def skip_reasons(settings: Settings) -> dict[str, tuple[str, str | None]]:
    with Session(Runtime(settings).engine) as session:
        rows = session.exec(select(Event)).all()
        return {e.event_id: (e.status, e.skip_reason) for e in rows}


def metric(client: TestClient, name: str, **labels: str) -> float:
    text = client.get("/metrics").text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def test_the_oldest_normal_events_over_the_bound_are_shed(settings: Settings) -> None:
    settings = settings.model_copy(update={"shed_max_pending": 5})
    with TestClient(create_app(settings)) as client:
        ids = backlog(client)
        assert shed_backlog(Runtime(settings)) == 7
        assert shed_backlog(Runtime(settings)) == 0  # at the bound now: nothing more to shed
        shed = metric(client, "retrieval_monitor_events_skipped_total", reason="shed")
    state = skip_reasons(settings)
    assert {i for i, (status, _) in state.items() if status == "skipped"} == set(ids[:7])
    assert all(state[i] == ("skipped", "shed") for i in ids[:7])
    assert all(state[i] == ("pending", None) for i in ids[7:])
    assert state["gold-0"][0] == state["gold-1"][0] == state["urgent"][0] == "pending"
    assert shed == 7


def test_no_bound_no_shedding(settings: Settings) -> None:
    with TestClient(create_app(settings)) as client:
        backlog(client)
    assert shed_backlog(Runtime(settings)) == 0
    assert all(status == "pending" for status, _ in skip_reasons(settings).values())


def test_a_worker_judges_the_rest_and_leaves_shed_events_alone(
    llm_settings: Settings, worker_factory: WorkerFactory, fake_llm: FakeLLM
) -> None:
    settings = llm_settings.model_copy(update={"shed_max_pending": 5})
    fake_llm.set_labels(default_grade=2)
    with TestClient(create_app(settings)) as client:
        ids = backlog(client)
        assert shed_backlog(Runtime(settings)) == 7
        # The shed events' tasks are still queued, ahead of the others.
        worker_factory(settings).start()

        def settled() -> bool:
            state = skip_reasons(settings)
            return sum(status == "judged" for status, _ in state.values()) == 8

        wait_for(settled, timeout=90)
        body: dict[str, Any] = client.get(f"/v1/events/{ids[0]}").json()
    state = skip_reasons(settings)
    assert body["status"] == "skipped"
    assert all(state[i] == ("skipped", "shed") for i in ids[:7])
    assert all(state[i][0] == "judged" for i in [*ids[7:], "gold-0", "gold-1", "urgent"])


def test_a_tenants_flood_sheds_its_own_events_only(
    tmp_path: Path, store_url: str, redis_url: str
) -> None:
    settings = make_settings(tmp_path, store_url, redis_url, auth_required=True, shed_max_pending=4)
    with TestClient(create_app(settings)) as client:
        acme, globex = make_key(settings, "acme"), make_key(settings, "globex")
        quiet = [make_event(f"acme-{i}", n=3, query=f"acme {i}") for i in range(3)]
        flood = [make_event(f"globex-{i}", n=3, query=f"globex {i}") for i in range(10)]
        for key, events in ((acme, quiet), (globex, flood)):
            headers = {"Authorization": f"Bearer {key}"}
            answer = client.post("/v1/events/batch", json={"events": events}, headers=headers)
            assert answer.status_code == 200
        # acme's events came first and are the oldest; only globex is over the bound.
        assert shed_backlog(Runtime(settings)) == 6
    state = skip_reasons(settings)
    assert all(state[f"acme-{i}"] == ("pending", None) for i in range(3))
    assert all(state[f"globex-{i}"] == ("skipped", "shed") for i in range(6))
    assert all(state[f"globex-{i}"] == ("pending", None) for i in range(6, 10))
