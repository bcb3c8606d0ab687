"""The analysis over a real migrated database: the API, the command line and the gauges.

Events, judgments and scores are written through the same repository functions the service and
the workers use, with gold ranks, judge grades and answers planned here, so every figure the
analysis reports can be recomputed from the plan.

Tests ``service.analysis.runner``, ``service.analysis.report``, ``service.analysis.plots``,
``service.analysis.gauges``, ``service.api.analysis`` and ``service.cli.analyze``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector
from sqlmodel import Session, select

from service.analysis.dataset import judged_traffic
from service.analysis.gauges import CachedCalibrationGauges, calibration_gauges
from service.api.app import create_app
from service.cli.analyze import add_analyze_command
from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.measures.catalogue import MEASURE_NAMES
from service.measures.formulas import EventLabels, compute_measures
from service.store import analysis as repo
from service.store import events as event_store
from service.store import judging as judging_store
from service.store.engine import make_engine, session_scope
from service.store.judging import JudgeIdentity, JudgingResult
from service.store.migrate import upgrade
from service.store.models import Score
from tests.support.environment import make_settings

JUDGE = JudgeIdentity("llm", "gpt-test", "v1")
NOW = datetime.now(UTC).replace(microsecond=0)
RECENT = NOW - timedelta(hours=1)
OLD = NOW - timedelta(days=10)
# Gold rank per question (None: not retrieved), cycling; the prompt carries k=3 of 6 passages.
PLAN_A = [1, 1, 1, 2, 2, 3, 5, 6, None, None]  # hit@3 for 6 of 10
PLAN_B = [1, 1, 1, 1, 2, 2, 3, 3, 4, None]  # hit@3 for 8 of 10
GOLD_K = 3


@dataclass(frozen=True)
class Planned:
    retriever: str
    rank: int | None
    correct: bool
    judge_grades: list[int]
    gold_id: str
    ranked: list[str]


def _store(
    session: Session,
    *,
    event_id: str,
    retriever: str,
    ranked: list[str],
    k: int,
    grades: list[int],
    now: datetime,
    gold: list[str] | None = None,
    response_grade: int | None = None,
    answer_correct: bool | None = None,
    candidates: list[str] | None = None,
    judge: JudgeIdentity = JUDGE,
) -> None:
    event = EventIn.model_validate(
        {
            "app": "shop",
            "retriever": retriever,
            "query": f"question {event_id.split('-')[-1]}",
            "passages": [{"id": pid, "text": f"text of {pid}"} for pid in ranked],
            "k": k,
            "gold_passage_ids": gold,
            "response_grade": response_grade,
            "answer_correct": answer_correct,
            "candidates": None if candidates is None else [{"id": c} for c in candidates],
        }
    )
    (inserted,) = event_store.insert_events(session, "default", [(event_id, event)], now)
    assert inserted.pk is not None
    loaded = judging_store.load_for_judging(session, inserted.pk)
    assert loaded is not None
    judged = [p.passage_id for p in loaded.passages]
    own_grades = grades[: len(judged)]
    labels = EventLabels(
        grades=own_grades,
        k=k,
        context_rating=1,
        gold_relevant=None if gold is None else [pid in gold for pid in judged],
        n_gold=None if gold is None else len(set(gold)),
    )
    measures = compute_measures(labels, 0.5)
    stored = judging_store.store_judging(
        session,
        loaded,
        judge,
        JudgingResult(
            grades=own_grades,
            from_cache=[False] * len(judged),
            context_rating=1,
            calls=1,
            prompt_tokens=10,
            completion_tokens=5,
            malformed_replies=0,
            new_cache_entries={},
            query_hash="q",
            measures=measures,
            np_window=int(measures["np_window"] or 0),
            alpha=0.5,
            threshold=2,
        ),
    )
    assert stored


def _gold_plan(retriever: str, plan: list[int | None], count: int) -> list[Planned]:
    out = []
    for i in range(count):
        rank = plan[i % len(plan)]
        gold_id = f"{retriever}-g{i}"
        ranked = [f"{retriever}-n{i}-{r}" for r in range(6)]
        if rank is not None:
            ranked[rank - 1] = gold_id
        grades = []
        for position, pid in enumerate(ranked, start=1):
            if pid == gold_id:
                grades.append(3 if i % 5 else 1)  # the judge misses every fifth gold passage
            else:
                grades.append(2 if position == 4 and i % 3 == 0 else 0)
        correct = rank is not None and rank <= GOLD_K and i % 4 != 0
        out.append(Planned(retriever, rank, correct, grades, gold_id, ranked))
    return out


@dataclass(frozen=True)
class Plan:
    database_url: str
    a: list[Planned]
    b: list[Planned]


@dataclass(frozen=True)
class World:
    settings: Settings
    a: list[Planned]
    b: list[Planned]


def _fill(session: Session) -> tuple[list[Planned], list[Planned]]:
    plan_a = _gold_plan("bm25-v1", PLAN_A, 40)
    plan_b = _gold_plan("dense-v2", PLAN_B, 40)
    rng = np.random.default_rng(0)
    for name, plan in (("a", plan_a), ("b", plan_b)):
        for i, item in enumerate(plan):
            first_stage = None
            if item.retriever == "dense-v2":
                # The first stage finds every gold passage, the rerank keeps most of them.
                first_stage = [item.gold_id] + [f"c{j}" for j in range(19)]
            _store(
                session,
                event_id=f"{name}-{i}",
                retriever=item.retriever,
                ranked=item.ranked,
                k=GOLD_K,
                grades=item.judge_grades,
                now=RECENT,
                gold=[item.gold_id],
                answer_correct=item.correct,
                candidates=first_stage,
            )
    # Traffic without gold whose answers follow how many relevant passages the prompt had.
    for i in range(60):
        grades = rng.integers(0, 4, 8).tolist()
        relevant = sum(g >= 2 for g in grades[:4])
        _store(
            session,
            event_id=f"live-{i}",
            retriever="bm25-v1",
            ranked=[f"live{i}-{r}" for r in range(8)],
            k=4,
            grades=grades,
            now=RECENT,
            response_grade=min(5, 1 + relevant + int(rng.integers(0, 2))),
        )
    # Last week's gold traffic, outside the default window: every question missed.
    for i in range(10):
        _store(
            session,
            event_id=f"old-{i}",
            retriever="bm25-v1",
            ranked=[f"old{i}-{r}" for r in range(6)],
            k=GOLD_K,
            grades=[0] * 6,
            now=OLD,
            gold=[f"old{i}-gold"],
            answer_correct=False,
        )
    session.commit()
    return plan_a, plan_b


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> Plan:
    """One database for the module: every test here only reads it."""
    url = f"sqlite:///{tmp_path_factory.mktemp('analysis') / 'rm.db'}"
    upgrade(url)
    engine = make_engine(url)
    with session_scope(engine) as session:
        plan_a, plan_b = _fill(session)
    engine.dispose()
    return Plan(url, plan_a, plan_b)


@pytest.fixture
def world(plan: Plan, tmp_path: Path, redis_url: str) -> World:
    return World(make_settings(tmp_path, plan.database_url, redis_url), plan.a, plan.b)


@pytest.fixture
def analysis_client(world: World) -> Iterator[TestClient]:
    app = create_app(world.settings)  # the analysis routes are part of the app
    with TestClient(app) as test_client:
        yield test_client


def _iso(moment: datetime) -> str:
    return moment.isoformat()


def _window() -> dict[str, str]:
    return {"since": _iso(NOW - timedelta(days=1)), "until": _iso(NOW + timedelta(minutes=1))}


def _ceiling(plan: list[Planned]) -> float:
    return sum(1 for p in plan if p.rank is not None and p.rank <= GOLD_K) / len(plan)


def _calibration(plan: list[Planned]) -> tuple[int, int, int, int]:
    tp = fp = fn = tn = 0
    for item in plan:
        for pid, grade in zip(item.ranked, item.judge_grades, strict=True):
            judge, gold = grade >= 2, pid == item.gold_id
            tp += judge and gold
            fp += judge and not gold
            fn += gold and not judge
            tn += not judge and not gold
    return tp, fp, fn, tn


# ---------------------------------------------------------------------------------------------


def test_analysis_report_over_the_api(analysis_client: TestClient, world: World) -> None:
    response = analysis_client.get("/v1/analysis", params=_window())
    assert response.status_code == 200, response.text
    report = response.json()
    counts = report["counts"]
    assert counts == {
        "events": 140,
        "judged": 140,
        "graded": 60,
        "gold": 80,
        "gold_with_feedback": 80,
        "truncated": False,
        "judges": [{"judge": "llm", "prompt_version": "v1", "events": 140}],
    }
    assert (report["scope"]["judge"], report["scope"]["prompt_version"]) == ("llm", "v1")

    gold = report["gold"]
    both = world.a + world.b
    assert gold["ceiling"]["value"] == pytest.approx(_ceiling(both))
    hits = [p for p in both if p.rank is not None and p.rank <= GOLD_K]
    assert gold["conversion"]["value"] == pytest.approx(sum(p.correct for p in hits) / len(hits))
    assert gold["observed_accuracy"]["value"] == pytest.approx(
        sum(p.correct for p in both) / len(both)
    )
    expected_mrr = sum(1 / p.rank for p in both if p.rank is not None and p.rank <= GOLD_K) / 80
    assert gold["mrr"]["value"] == pytest.approx(expected_mrr)
    curve = {point["cutoff"]: point for point in gold["curve"]}
    assert set(curve) == {1, 3, 5}  # the events carry 6 passages
    assert curve[5]["hit"]["value"] == pytest.approx(
        sum(1 for p in both if p.rank is not None and p.rank <= 5) / 80
    )
    staged = gold["first_stage"]
    assert staged["events"] == 40
    assert staged["first_stage_hit"]["value"] == 1.0
    assert staged["dropped"] == 40 - round(_ceiling(world.b) * 40)

    (calibration,) = report["calibration"]
    tp, fp, fn, tn = _calibration(both)
    assert calibration["confusion"] == {
        "true_positive": tp,
        "false_positive": fp,
        "false_negative": fn,
        "true_negative": tn,
    }
    assert calibration["precision"]["value"] == pytest.approx(tp / (tp + fp))
    assert calibration["recall"]["value"] == pytest.approx(tp / (tp + fn))
    assert (
        -1
        <= calibration["kappa"]["low"]
        < calibration["kappa"]["kappa"]
        < calibration["kappa"]["high"]
    )

    correlation = report["correlation"]
    assert correlation["graded_events"] == 60
    t_all = next(r for r in correlation["rows"] if (r["measure"], r["regime"]) == ("t", "all"))
    assert t_all["n"] == 60
    assert t_all["spearman"] > 0.5
    assert correlation["recommendation"]["basis"] == "data"
    assert len(correlation["alpha_grid"]) == 21
    # JSON has no NaN: undefined figures (F on traffic without gold) are null.
    f_all = next(r for r in correlation["rows"] if (r["measure"], r["regime"]) == ("f", "all"))
    assert f_all["n"] == 0
    assert f_all["spearman"] is None


def test_the_window_and_the_filters_select_events(analysis_client: TestClient) -> None:
    only_b = analysis_client.get("/v1/analysis", params={**_window(), "retriever": "dense-v2"})
    assert only_b.json()["counts"]["events"] == 40
    assert only_b.json()["gold"]["ceiling"]["value"] == pytest.approx(0.8)
    last_month = analysis_client.get("/v1/analysis", params={"since": "30d"}).json()
    assert last_month["counts"]["events"] == 150
    nothing = analysis_client.get("/v1/analysis", params={**_window(), "app": "other"}).json()
    assert nothing["counts"]["events"] == 0
    assert nothing["gold"] is None
    assert nothing["correlation"] is None
    assert "no events in this window" in nothing["notes"]
    capped = analysis_client.get("/v1/analysis", params={**_window(), "max_events": 10}).json()
    # The ten most recent events (live traffic), and every gold event of the window besides.
    assert capped["counts"]["truncated"] is True
    assert capped["counts"]["gold"] == 80
    assert capped["counts"]["events"] == 90
    unknown = analysis_client.get("/v1/analysis", params={**_window(), "judge": "nobody"}).json()
    assert unknown["correlation"] is None
    assert unknown["notes"]


def test_bad_windows_are_refused(analysis_client: TestClient) -> None:
    assert analysis_client.get("/v1/analysis", params={"since": "yesterday"}).status_code == 422
    empty = analysis_client.get("/v1/analysis", params={"since": "1h", "until": "2h"})
    assert empty.status_code == 422
    assert "empty" in empty.json()["detail"]
    half = analysis_client.get("/v1/analysis/compare", params={"retriever_a": "bm25-v1"})
    assert half.status_code == 422


def test_two_retrievers_compared(analysis_client: TestClient, world: World) -> None:
    response = analysis_client.get(
        "/v1/analysis/compare",
        params={**_window(), "retriever_a": "bm25-v1", "retriever_b": "dense-v2"},
    )
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["a"]["label"] == "retriever bm25-v1"
    assert (report["a"]["gold_events"], report["b"]["gold_events"]) == (40, 40)
    quantities = {q["name"]: q["test"] for q in report["quantities"]}
    ceiling = quantities["ceiling"]
    assert ceiling["a"] == pytest.approx(0.6)
    assert ceiling["b"] == pytest.approx(0.8)
    assert ceiling["difference"] == pytest.approx(0.2)
    assert ceiling["minimum_detectable"] > 0.2
    assert ceiling["real"] is (ceiling["p_value"] < 0.05)
    # The same 40 questions under both retrievers: a paired test on top of the two samples.
    paired = report["paired_ceiling"]
    assert paired is not None
    assert paired["test"]["n_a"] == 40
    assert report["predicted_b"]["value"] == pytest.approx(
        0.8 * sum(p.correct for p in world.a) / sum(1 for p in world.a if p.rank and p.rank <= 3)
    )
    assert "precision" in quantities  # judge measures of both sides at the default alpha


def test_a_window_compared_with_the_one_before(analysis_client: TestClient) -> None:
    params = {
        "since": _iso(NOW - timedelta(days=2)),
        "until": _iso(NOW),
        "retriever": "bm25-v1",
        "baseline_since": _iso(NOW - timedelta(days=12)),
        "baseline_until": _iso(NOW - timedelta(days=2)),
    }
    report = analysis_client.get("/v1/analysis/compare", params=params).json()
    quantities = {q["name"]: q["test"] for q in report["quantities"]}
    assert (quantities["ceiling"]["a"], quantities["ceiling"]["n_a"]) == (0.0, 10)
    assert quantities["ceiling"]["b"] == pytest.approx(0.6)
    assert quantities["ceiling"]["real"] is True


def test_recomputed_measures_equal_the_stored_scores(world: World) -> None:
    """The analysis recomputes every measure from the stored labels; at the alpha the workers
    used, it must reproduce their scores exactly."""
    engine = make_engine(world.settings.database_url)
    window = repo.EventWindow(NOW - timedelta(days=30), NOW + timedelta(minutes=1))
    with session_scope(engine) as session:
        events, _ = repo.events_in_window(session, window)
        pks = [e.pk for e in events]
        traffic = judged_traffic(
            events,
            repo.grades_by_event(session, pks, "llm", "v1"),
            repo.context_ratings(session, pks, "llm", "v1"),
            repo.passage_ids(session, pks),
            threshold=2,
        )
        scores = {s.event_pk: s for s in session.exec(select(Score)).all()}
    engine.dispose()
    recomputed = traffic.measures(0.5)
    judged = [e for e in events if e.pk in scores]
    assert len(judged) == traffic.size == 150
    for row, event in enumerate(judged):
        for name in MEASURE_NAMES:
            stored = getattr(scores[event.pk], name)
            value = recomputed[name][row]
            if stored is None:
                assert np.isnan(value), (event.pk, name)
            else:
                assert value == pytest.approx(stored), (event.pk, name)


def test_gold_events_query_skips_events_without_gold(world: World) -> None:
    engine = make_engine(world.settings.database_url)
    window = repo.EventWindow(NOW - timedelta(days=30), NOW + timedelta(minutes=1))
    with session_scope(engine) as session:
        gold = repo.gold_events_in_window(session, window)
    engine.dispose()
    assert len(gold) == 90
    assert all(e.has_gold for e in gold)


# ---------------------------------------------------------------------------------------------
# Command line


def _run_cli(world: World, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_analyze_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analyze", *argv])
    result: int = args.handler(args, world.settings)
    return result


def test_cli_prints_the_table(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_cli(world, "--since", "1d") == 0
    out = capsys.readouterr().out
    assert "judge: llm (prompt v1)" in out
    assert "Which measure tracks answer quality" in out
    assert "Lead with:" in out
    assert "ceiling (hit@k)" in out
    assert "conversion" in out
    assert "Judge against gold labels" in out


def test_cli_json_and_plots(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run_cli(world, "--since", "1d", "--json", "--plots", str(tmp_path / "figs")) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["counts"]["events"] == 140
    written = sorted(p.name for p in (tmp_path / "figs").iterdir())
    assert written == ["alpha.png", "calibration.png", "correlation.png", "gold.png", "regime.png"]
    for name in written:
        assert (tmp_path / "figs" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in captured.err


def test_cli_compares_retrievers_and_windows(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = _run_cli(
        world,
        "--since",
        "1d",
        "--compare-retriever",
        "bm25-v1",
        "dense-v2",
        "--plots",
        str(tmp_path),
    )
    assert code == 0
    out = capsys.readouterr().out
    assert "A (baseline): retriever bm25-v1" in out
    assert "ceiling (paired)" in out
    assert (tmp_path / "compare.png").is_file()
    assert (
        _run_cli(
            world,
            "--since",
            "2d",
            "--retriever",
            "bm25-v1",
            "--compare-windows",
            "--baseline",
            "12d",
            "2d",
            "--json",
        )
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["a"]["gold_events"] == 10


def test_cli_refuses_bad_input(world: World, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run_cli(world, "--since", "soon") == 2
    assert "not a time" in capsys.readouterr().err
    assert _run_cli(world, "--baseline", "3d", "2d") == 2


def test_cli_says_when_the_database_is_not_ready(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = Settings.model_validate({"database_url": f"sqlite:///{tmp_path / 'empty.db'}"})
    parser = argparse.ArgumentParser()
    add_analyze_command(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["analyze"])
    assert args.handler(args, settings) == 1
    assert "retrieval-monitor migrate" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Gauges


class _Families(Collector):
    def __init__(self, source: object) -> None:
        self.source = source

    def collect(self):  # type: ignore[no-untyped-def]
        assert callable(self.source)
        yield from self.source()


def test_calibration_gauges_export_the_judge_against_gold(world: World) -> None:
    engine = make_engine(world.settings.database_url)
    with session_scope(engine) as session:
        families = calibration_gauges(session)
    registry = CollectorRegistry()
    registry.register(_Families(lambda: families))
    labels = {"tenant": "default", "judge": "llm", "prompt_version": "v1"}
    # The default 24 hours hold the 80 recent gold events, not last week's ten.
    tp, fp, fn, _tn = _calibration(world.a + world.b)
    assert registry.get_sample_value("retrieval_monitor_judge_gold_precision", labels) == (
        pytest.approx(tp / (tp + fp))
    )
    assert registry.get_sample_value("retrieval_monitor_judge_gold_recall", labels) == (
        pytest.approx(tp / (tp + fn))
    )
    assert registry.get_sample_value("retrieval_monitor_judge_gold_passages", labels) == 480
    kappa = registry.get_sample_value("retrieval_monitor_judge_gold_kappa", labels)
    assert kappa is not None
    assert 0 < kappa < 1

    cached = CachedCalibrationGauges(engine, ttl_seconds=3600)
    first = list(cached.collect())
    assert [f.name for f in first] == [f.name for f in families]
    with session_scope(engine) as session:
        later = calibration_gauges(session, now=NOW + timedelta(days=3))
    assert all(not family.samples for family in later)
    engine.dispose()


def test_cached_gauges_survive_an_unreadable_database(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'not-migrated.db'}")
    assert list(CachedCalibrationGauges(engine).collect()) == []
    engine.dispose()


@pytest.mark.postgres
def test_analysis_queries_run_on_postgresql(postgres_url: str) -> None:
    upgrade(postgres_url)
    engine = make_engine(postgres_url)
    plan = _gold_plan("bm25-v1", PLAN_A, 10)
    with session_scope(engine) as session:
        for i, item in enumerate(plan):
            _store(
                session,
                event_id=f"pg-{i}",
                retriever=item.retriever,
                ranked=item.ranked,
                k=GOLD_K,
                grades=item.judge_grades,
                now=RECENT,
                gold=[item.gold_id],
                answer_correct=item.correct,
            )
        _store(
            session,
            event_id="pg-live",
            retriever="bm25-v1",
            ranked=["x", "y"],
            k=1,
            grades=[3, 0],
            now=RECENT,
            response_grade=4,
        )
        session.commit()
        window = repo.EventWindow(NOW - timedelta(days=1), NOW + timedelta(minutes=1))
        assert len(repo.gold_events_in_window(session, window)) == 10
        families = {f.name: f for f in calibration_gauges(session)}
        assert families["retrieval_monitor_judge_gold_passages"].samples[0].value == 60
        from service.analysis.runner import AnalysisRequest, run_analysis

        report = run_analysis(session, AnalysisRequest(window=window))
    engine.dispose()
    assert report.gold is not None
    assert report.gold.ceiling.value == pytest.approx(0.6)
    assert report.counts.judged == 11


def test_the_routes_are_documented(analysis_client: TestClient) -> None:
    paths = analysis_client.get("/openapi.json").json()["paths"]
    analysis = paths["/v1/analysis"]["get"]
    assert "gold-traffic recall" in analysis["description"]
    assert {p["name"] for p in analysis["parameters"]} >= {"since", "until", "app", "retriever"}
    compare_params = {p["name"] for p in paths["/v1/analysis/compare"]["get"]["parameters"]}
    assert {"retriever_a", "retriever_b", "baseline_since", "baseline_until"} <= compare_params
