"""Re-judging stored events with another judge: resumable, budget-aware, scores side by side.

Tests ``service.cli.rejudge``.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlmodel import Session, col, func, select

from service.api.app import create_app
from service.cli.main import build_parser
from service.config.settings import Settings, get_settings
from service.primitives.clock import utcnow
from service.replay.rejudge import Rejudge, RejudgePlan
from service.spend.budget import Budget, Reservation
from service.store.models import Event, Score
from service.wiring.runtime import Runtime
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event
from tests.support.live import WorkerFactory, wait_for


def plan(**extra: object) -> RejudgePlan:
    now = utcnow()
    values: dict[str, object] = {
        "since": now - timedelta(hours=1),
        "until": now + timedelta(minutes=5),
        "tenant": "default",
        "app": None,
        "retriever": None,
        "overrides": {"judge_model": "fake-judge-b"},
    }
    values.update(extra)
    return RejudgePlan(**values)  # type: ignore[arg-type]


def scores_by_judge(settings: Settings) -> dict[str, int]:
    with Session(Runtime(settings).engine) as session:
        rows = session.exec(select(Score.judge, func.count()).group_by(Score.judge)).all()
    return {judge: count for judge, count in rows}


def test_rejudge_resumes_and_keeps_both_series(
    llm_settings: Settings, broker_url: str, worker_factory: WorkerFactory, fake_llm: FakeLLM
) -> None:
    """On either broker: the rejudge sends and throttles on the queue RM_BROKER_URL names."""
    settings = llm_settings.model_copy(update={"broker_url": broker_url})
    fake_llm.set_labels(default_grade=2)
    events = [make_event(f"ev-{i}", n=3, query=f"question {i}") for i in range(6)]
    rt = Runtime(settings)
    with TestClient(create_app(settings)) as client:
        worker_factory(settings).start()
        assert client.post("/v1/events/batch", json={"events": events}).status_code == 200
        wait_for(lambda: scores_by_judge(settings).get("fake-judge") == 6, timeout=60)

        rejudge = Rejudge(rt, Celery(broker=settings.judge_broker_url, set_as_current=False))
        first = rejudge.run(plan(), batch_size=1, limit=2, progress=False)
        assert (first.total, first.sent) == (2, 2)
        with Session(rt.engine) as session:
            second_pk = session.exec(select(Event.id).where(Event.event_id == "ev-1")).one()
        assert rejudge.cursor(plan()) == second_pk

        resumed = rejudge.run(plan(), batch_size=3, progress=False)
        assert (resumed.total, resumed.sent) == (4, 4)  # only what the first run left
        wait_for(lambda: scores_by_judge(settings).get("fake-judge-b") == 6, timeout=60)
        assert scores_by_judge(settings) == {"fake-judge": 6, "fake-judge-b": 6}
        assert rejudge.run(plan(), progress=False).total == 0

        # A fresh run of another selection skips what that judge already scored.
        other = plan(app="shop", retriever="bm25-v1")
        assert rejudge.run(other, progress=False).total == 0

        stored = client.get("/v1/events/ev-0").json()
        assert stored["status"] == "judged"
        metrics = client.get("/metrics").text
    for judge in ("fake-judge", "fake-judge-b"):
        assert f'judge="{judge}"' in metrics


def test_rejudge_stops_or_waits_when_a_budget_is_spent(settings: Settings) -> None:
    settings = settings.model_copy(update={"budget_tokens_per_hour": 10.0})
    rt = Runtime(settings)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events", json=make_event("ev-0")).status_code == 202
    with Session(rt.engine) as session:
        event = session.exec(select(Event)).one()
        event.status = "judged"
        session.add(event)
        session.commit()
    budget = Budget(rt.redis, settings)
    held = budget.reserve("default", "shop", "m", 100, 0)
    assert isinstance(held, Reservation)

    sender = Celery(broker=settings.redis_url, set_as_current=False)
    queued = rt.redis.llen(settings.queue_name)  # the ingest's own task
    stopped = Rejudge(rt, sender).run(plan(), wait_for_budget=False, progress=False)
    assert stopped.stopped_for_budget == "shop"
    assert stopped.sent == 0
    assert rt.redis.llen(settings.queue_name) == queued

    pauses: list[float] = []

    def window_resets(seconds: float) -> None:
        pauses.append(seconds)
        for key in budget.keys("default", "shop", time.time()):
            rt.redis.delete(key)

    waited = Rejudge(rt, sender, sleep=window_resets).run(plan(), progress=False)
    assert waited.sent == 1
    assert len(pauses) == 1
    assert 0 < pauses[0] <= 60
    assert rt.redis.llen(settings.queue_name) == queued + 1


def test_a_new_prompt_version_rejudges_what_the_same_model_scored_before(
    settings: Settings,
) -> None:
    rt = Runtime(settings)
    with TestClient(create_app(settings)) as client:
        for i in range(2):
            assert client.post("/v1/events", json=make_event(f"ev-{i}")).status_code == 202
    with Session(rt.engine) as session:
        events = session.exec(select(Event).order_by(col(Event.id))).all()
        for event in events:
            event.status = "judged"
            session.add(event)
        # Both were scored by the workers' model under an earlier prompt version, and the first
        # also by another model.
        for event in events:
            session.add(score_row(event, settings.judge_model, "v0"))
        session.add(score_row(events[0], "other-model", "v0"))
        session.commit()
    sender = Celery(broker=settings.redis_url, set_as_current=False)

    # The workers' model: every event goes, the workers tell the versions apart.
    same = plan(overrides={"judge_model": settings.judge_model})
    assert Rejudge(rt, sender).run(same, progress=False).total == 2
    # Another model: what it already scored is left out before sending.
    other = plan(overrides={"judge_model": "other-model"})
    assert Rejudge(rt, sender).run(other, progress=False).total == 1


def score_row(event: Event, judge: str, prompt_version: str) -> Score:
    assert event.id is not None
    return Score(
        event_pk=event.id,
        judge=judge,
        prompt_version=prompt_version,
        alpha=0.5,
        np_window=0,
        created_at=utcnow(),
    )


def test_the_command_needs_something_to_change(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["rejudge", "--since", "1h"])
    assert args.handler(args, get_settings()) == 2
    assert "--judge-model" in capsys.readouterr().err


def test_a_prompt_change_does_not_skip_events_the_model_already_scored() -> None:
    assert plan().target_judge == "fake-judge-b"
    assert plan(overrides={"judge_model": "m", "judge_shuffle": "true"}).target_judge is None
    assert plan(window_text="7d..now").run_id == plan(window_text="7d..now").run_id
    assert plan(window_text="7d..now").run_id != plan(window_text="1d..now").run_id
