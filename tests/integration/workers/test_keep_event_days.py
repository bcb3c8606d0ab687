"""The scheduler's hourly job, run by a real worker: the day partitions made ahead, and the events
past RM_KEEP_EVENTS_DAYS removed whole while the recent ones and their measures stay."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.api.app import create_app
from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.queue.tasks import KEEP_DAYS_TASK
from service.store.engine import make_engine, session_scope
from service.store.events import insert_events
from service.store.partitions import (
    DAYS_AHEAD,
    PARTITIONED,
    day_number,
    ensure_days_ahead,
    existing_days,
    partition_name,
)
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import make_event
from tests.support.live import WorkerFactory, wait_for, wait_status


def test_the_hourly_job_removes_old_events_whole_and_makes_the_days_ahead(
    tmp_path: Path,
    store_url: str,
    redis_url: str,
    fake_llm: FakeLLM,
    worker_factory: WorkerFactory,
) -> None:
    engine = make_engine(store_url)
    now = utcnow()
    old_day = now - timedelta(days=5)
    ensure_days_ahead(engine, day_number(old_day), 0)
    with session_scope(engine) as session:
        old = EventIn.model_validate(make_event("old", n=2))
        insert_events(session, "default", [("old", old)], old_day)
        session.commit()
    postgres = engine.dialect.name == "postgresql"
    settings = make_settings(
        tmp_path, store_url, redis_url, judge_base_url=fake_llm.base_url, keep_events_days=2
    )
    worker_factory(settings).start()
    with TestClient(create_app(settings)) as client:
        client.post("/v1/events", json=make_event("new", n=2))
        judged = wait_status(client, "new")
        assert client.get("/v1/events/old").status_code == 200
        if postgres:  # a day ahead as if nothing had made it: the job does
            _drop_day_ahead(engine, day_number(now) + 2)
        Celery(broker=redis_url).send_task(KEEP_DAYS_TASK, queue=f"{settings.queue_name}.urgent")
        wait_for(lambda: client.get("/v1/events/old").status_code == 404, timeout=60)
        # The recent event and its measures stay; the removed one is new again when resent.
        assert client.get("/v1/events/new").json()["measures"] == judged["measures"]
        assert client.post("/v1/events", json=make_event("old", n=2)).status_code == 202
    if postgres:
        with engine.connect() as conn:
            days = existing_days(conn)
        assert set(range(day_number(now), day_number(now) + DAYS_AHEAD + 1)) <= set(days)
        assert day_number(old_day) not in days
    engine.dispose()


def _drop_day_ahead(engine: Engine, day: int) -> None:
    with engine.begin() as conn:
        for table, _column in PARTITIONED:
            if table == "events":
                conn.exec_driver_sql(
                    f"ALTER TABLE events DETACH PARTITION {partition_name(table, day)}"
                )
            conn.exec_driver_sql(f"DROP TABLE {partition_name(table, day)}")
        assert day not in existing_days(conn)
