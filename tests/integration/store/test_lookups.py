"""The hot lookups: known event ids at ingest (on PostgreSQL in ``event_keys``) and cached labels
at judging.

Each reads exactly the keys asked for, on both stores, and on PostgreSQL probes the unique key
once per wanted row whether or not the planner has statistics (a server with autovacuum off has
none, and a scan of every row of the tenant or the judge per statement grows with the table).

Tests ``service.store.judging`` and ``service.telemetry.rebuild``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.store.engine import make_engine, session_scope
from service.store.events import (
    insert_events,
    known_payload_hashes,
    pending_by_tenant,
    pending_summary,
)
from service.store.judging import JudgeIdentity, cached_labels_many
from tests.support.helpers import make_event

WHO = JudgeIdentity(judge="llm", model="m", prompt_version="v3")


def fill_labels(engine: Engine, queries: int, passages: int) -> None:
    """Every (query, passage) pair graded for tenant t1, as after a warm-up: grade = (q + p) % 4."""
    rows = [
        {
            "tenant": "t1",
            "judge": WHO.judge,
            "model": WHO.model,
            "prompt_version": WHO.prompt_version,
            "query_hash": f"q{q}",
            "passage_hash": f"p{p}",
            "grade": (q + p) % 4,
            "created_at": utcnow(),
        }
        for q in range(queries)
        for p in range(passages)
    ]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO label_cache (tenant, judge, model, prompt_version, query_hash,"
                " passage_hash, grade, created_at) VALUES (:tenant, :judge, :model,"
                " :prompt_version, :query_hash,"
                " :passage_hash, :grade, :created_at)"
            ),
            rows,
        )


def test_cached_labels_are_the_pairs_asked_for_not_every_combination(store_url: str) -> None:
    engine = make_engine(store_url)
    fill_labels(engine, queries=5, passages=20)
    wanted = {
        ("t1", "q1"): {"p2", "p3"},
        ("t1", "q4"): {"p3", "p19", "not-graded"},
        ("t1", "unknown"): {"p1"},
        ("t2", "q1"): {"p2", "p3"},
    }
    with session_scope(engine) as session:
        found = cached_labels_many(session, WHO, wanted)
        other_judge = cached_labels_many(session, JudgeIdentity("llm", "m", "v2"), wanted)
    engine.dispose()
    # q1 x p19 and q4 x p2 exist in the table but were not asked for; t2 has no grades of its own.
    assert found == {
        ("t1", "q1", "p2"): 3,
        ("t1", "q1", "p3"): 0,
        ("t1", "q4", "p3"): 3,
        ("t1", "q4", "p19"): 3,
    }
    assert other_judge == {}


def test_known_payload_hashes_are_the_tenants_own(store_url: str) -> None:
    engine = make_engine(store_url)
    events = [(f"e{i}", EventIn.model_validate(make_event(f"e{i}"))) for i in range(4)]
    with session_scope(engine) as session:
        insert_events(session, "t1", events[:3], utcnow())
        insert_events(session, "t2", events[3:], utcnow())
        session.commit()
        known = known_payload_hashes(session, "t1", ["e0", "e2", "e3", "e9", "e0"])
        assert known_payload_hashes(session, "t1", []) == {}
    engine.dispose()
    assert set(known) == {"e0", "e2"}
    assert all(len(digest) == 64 for digest in known.values())


@contextmanager
def captured_statements(engine: Engine) -> Iterator[list[tuple[str, Any]]]:
    seen: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        seen.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", capture)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", capture)


def plan_of(engine: Engine, run: Callable[[], object], table: str) -> str:
    """PostgreSQL's plan for the one statement ``run`` sends that reads ``table``."""
    with captured_statements(engine) as seen:
        run()
    statement, parameters = next((s, p) for s, p in seen if f"FROM {table}" in s)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars()
        return "\n".join(rows)


@pytest.mark.postgres
@pytest.mark.parametrize("statistics", ["none", "analyzed"])
def test_postgresql_probes_the_unique_keys_with_or_without_statistics(
    postgres_url: str, statistics: str
) -> None:
    engine = make_engine(postgres_url)
    fill_labels(engine, queries=50, passages=400)
    events = [(f"e{i}", EventIn.model_validate(make_event(f"e{i}"))) for i in range(3000)]
    with session_scope(engine) as session:
        insert_events(session, "t1", events, utcnow())
        session.commit()
    with engine.begin() as conn:
        for table in ("label_cache", "event_keys"):
            if statistics == "analyzed":
                conn.execute(text(f"ANALYZE {table}"))
            else:  # as on a server whose autovacuum never ran
                conn.execute(
                    text("DELETE FROM pg_statistic WHERE starelid = CAST(:t AS regclass)"),
                    {"t": table},
                )
    wanted = {("t1", f"q{q}"): {f"p{p}" for p in range(q, q + 6)} for q in range(16)}
    with session_scope(engine) as session:
        labels_plan = plan_of(
            engine, lambda: cached_labels_many(session, WHO, wanted), "label_cache"
        )
        ids_plan = plan_of(
            engine,
            lambda: known_payload_hashes(session, "t1", [f"e{i}" for i in range(0, 3000, 15)]),
            "event_keys",
        )
    engine.dispose()
    # PostgreSQL's duplicate check is its own table (the events are partitioned by day).
    for plan, key in ((labels_plan, "label_cache_pkey"), (ids_plan, "pk_event_keys")):
        assert "Nested Loop" in plan, plan
        assert f"Index Scan using {key}" in plan, plan
        assert "Seq Scan on" not in plan, plan
        assert "Bitmap" not in plan, plan


@pytest.mark.postgres
def test_postgresql_counts_pending_events_by_a_plain_index_scan(postgres_url: str) -> None:
    """The scrape's and the backlog check's pending counts read the status index by a plain
    index scan, which marks the dead entries judged events left (a bitmap scan never does, so
    without autovacuum its cost grows with every event judged), and count the right events."""
    engine = make_engine(postgres_url)
    # Enough events that the planner, without statistics, would read the index by a bitmap.
    events = [(f"e{i}", EventIn.model_validate(make_event(f"e{i}", n=1))) for i in range(20_000)]
    with session_scope(engine) as session:
        insert_events(session, "t1", events[:19_900], utcnow())
        insert_events(session, "t2", events[19_900:], utcnow())
        session.commit()
    with engine.begin() as conn:
        # Judged as workers judge: the rows' old versions stay behind, dead, under "pending".
        conn.execute(text("UPDATE events SET status = 'judged' WHERE tenant = 't1'"))
        # The events and each of their day partitions (service/store/partitions.py).
        conn.execute(
            text(
                "DELETE FROM pg_statistic WHERE starelid = 'events'::regclass OR starelid IN "
                "(SELECT inhrelid FROM pg_inherits WHERE inhparent = 'events'::regclass)"
            )
        )
    with session_scope(engine) as session, captured_statements(engine) as seen:
        summary = pending_summary(session)
        by_tenant = pending_by_tenant(session)
    assert summary.count == 100
    assert {tenant: s.count for tenant, s in by_tenant.items()} == {"t2": 100}
    counts = [(s, p) for s, p in seen if "FROM events" in s]
    assert len(counts) == 2
    with engine.connect() as conn:
        for statement, _parameters in seen:
            if statement.startswith("SET"):
                conn.exec_driver_sql(statement)  # as the function's transaction had it
        for statement, parameters in counts:
            plan = "\n".join(conn.exec_driver_sql("EXPLAIN " + statement, parameters).scalars())
            # The status index, as each partition names its copy of it.
            assert re.search(r"Index (Only )?Scan using \w*status\w*", plan), plan
            assert "Bitmap" not in plan, plan
            assert "Seq Scan" not in plan, plan
    engine.dispose()


@pytest.mark.postgres
def test_postgresql_pages_the_scores_in_id_order_by_index_across_day_partitions(
    postgres_url: str,
) -> None:
    """The aggregates' rebuild reads every score in id order, a page at a time: each page is an
    index scan of each day partition merged, never a scan and sort of every score (the primary
    key of a partitioned table must hold the event key; the id leads it). Without statistics,
    as a bulk load leaves the tables."""
    from service.store.judging import scored_events
    from service.store.partitions import day_number, partition_name
    from tests.benchmarks.earlier_events import fill

    fill(postgres_url, 3000)  # judged events: a score, a judge run and grades each
    engine = make_engine(postgres_url)
    with session_scope(engine) as session:
        plan = plan_of(engine, lambda: scored_events(session, 100, 1000), "scores")
        pages = 0
        after = 0
        while page := scored_events(session, after, 1000):
            ids = [int(scored.score.id or 0) for scored in page]
            assert ids == sorted(ids)
            assert ids[0] > after
            after = ids[-1]
            pages += 1
    engine.dispose()
    assert pages == 3
    today = partition_name("scores", day_number(utcnow()))
    assert "Merge Append" in plan, plan
    assert f"Index Scan using {today}_pkey" in plan, plan
    assert f"Seq Scan on {today}" not in plan, plan
    assert not re.search(r"Sort\s+\(cost", plan), plan  # no Sort node ("Sort Key" is the merge's)
