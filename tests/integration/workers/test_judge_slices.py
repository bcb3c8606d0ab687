"""Judging a slice of events in one task: one call per event, one transaction, one export, and
the same labels, costs and counts as judging the events one at a time.

The judge is the test's OpenAI-compatible HTTP server; storage is SQLite or PostgreSQL, and the
shared aggregates are in the real Redis.

Tests ``workers.judging``, ``workers.record`` and ``workers.calls``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import redis
from sqlalchemy import event, text
from sqlmodel import select

from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.primitives.clock import utcnow
from service.store.engine import session_scope
from service.store.events import insert_events
from service.store.judging import load_many_for_judging, store_judging_many
from service.store.migrate import upgrade
from service.store.models import JudgeRun, Judgment, Score
from service.telemetry.aggregates import Aggregates, Delta
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.fake_llm.fixture import FakeLLM
from workers import judging
from workers.judge import make_judge
from workers.judge.base import Judge
from workers.plan import EventWork, context_cache_key
from workers.record import judging_result

TEXTS = ("Homer wrote the Iliad.", "Troy was in Anatolia.", "Bread needs yeast.")


def slice_settings(
    tmp_path: Path, database_url: str, redis_url: str, fake: FakeLLM, **extra: object
) -> Settings:
    values: dict[str, object] = {
        "judge_base_url": fake.base_url,
        "judge_model": "fake-judge",
        "judge_max_retries": 0,
        **extra,
    }
    return make_settings(tmp_path, database_url, redis_url, **values)


def store(settings: Settings, events: list[tuple[str, list[str]]]) -> tuple[Runtime, list[int]]:
    """Store events (query, passage texts) the way the API does; their primary keys, in order."""
    upgrade(settings.database_url)
    runtime = Runtime(settings)
    runtime.aggregates.start_epoch(time.time())
    batch = [
        (
            f"ev-{i}",
            EventIn.model_validate(
                {
                    "app": "shop",
                    "retriever": "bm25",
                    "query": query,
                    "k": len(texts),
                    "passages": [{"id": f"d{j}", "text": t} for j, t in enumerate(texts)],
                }
            ),
        )
        for i, (query, texts) in enumerate(events)
    ]
    with session_scope(runtime.engine) as session:
        inserted = insert_events(session, "default", batch, utcnow())
        session.commit()
    pks = [row.pk for row in inserted]
    assert all(pk is not None for pk in pks)
    return runtime, [pk for pk in pks if pk is not None]


def judged_count(runtime: Runtime, judge: Judge) -> float:
    who = judge.identity
    key = ("events_judged", ("default", "shop", "bm25", "", who.judge, who.prompt_version), "")
    return runtime.aggregates.read().get(key, 0.0)


def runs(runtime: Runtime) -> dict[int, JudgeRun]:
    with session_scope(runtime.engine) as session:
        return {run.event_pk: run for run in session.exec(select(JudgeRun)).all()}


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_slice_costs_one_call_per_event_and_counts_each_event_once(
    database: str, request: pytest.FixtureRequest, tmp_path: Path, redis_url: str, fake_llm: FakeLLM
) -> None:
    database_url = request.getfixturevalue(
        "postgres_url" if database == "postgresql" else "sqlite_url"
    )
    settings = slice_settings(tmp_path, database_url, redis_url, fake_llm, judge_concurrency=4)
    fake_llm.set_labels({(None, TEXTS[0]): 3, (None, TEXTS[1]): 1})
    runtime, pks = store(settings, [(f"question {i}", list(TEXTS)) for i in range(6)])
    judge = make_judge(settings, runtime.redis)

    result = judging.judge_events(runtime, judge, pks)

    assert result.outcomes == dict.fromkeys(pks, "judged")
    assert fake_llm.stats()["calls"] == 6
    assert judged_count(runtime, judge) == 6
    with session_scope(runtime.engine) as session:
        scores = session.exec(select(Score)).all()
        grades = sorted((j.event_pk, j.rank, j.grade) for j in session.exec(select(Judgment)).all())
    assert sorted(s.event_pk for s in scores) == sorted(pks)
    # Threshold 2: only TEXTS[0] is relevant.
    assert [s.precision for s in scores] == [pytest.approx(1 / 3)] * 6
    assert grades == sorted(
        (pk, rank, g) for pk in pks for rank, g in zip((1, 2, 3), (3, 1, 0), strict=True)
    )

    # The same slice delivered again: nothing called, written or counted twice.
    again = judging.judge_events(runtime, judge, pks)
    assert again.outcomes == dict.fromkeys(pks, "already_judged")
    assert fake_llm.stats()["calls"] == 6
    assert judged_count(runtime, judge) == 6
    assert len(runs(runtime)) == 6


def test_events_of_a_slice_needing_the_same_labels_pay_for_them_once(
    tmp_path: Path, sqlite_url: str, redis_url: str, fake_llm: FakeLLM
) -> None:
    settings = slice_settings(tmp_path, sqlite_url, redis_url, fake_llm, judge_concurrency=8)
    same = ("who wrote the iliad", list(TEXTS))
    overlapping = ("who wrote the iliad", [TEXTS[0], "Achilles fought at Troy."])
    runtime, pks = store(settings, [same, same, overlapping, same])
    judge = make_judge(settings, runtime.redis)

    result = judging.judge_events(runtime, judge, pks)

    assert result.outcomes == dict.fromkeys(pks, "judged")
    requests = fake_llm.stats()["requests"]
    # The first event pays for its three passages; the third sends only its new passage (and its
    # whole top k once more, for the context rating of a different set); the repeats send nothing.
    assert len(requests) == 2
    by_event = runs(runtime)
    first, second, third, fourth = (by_event[pk] for pk in pks)
    assert (first.calls, third.calls) == (1, 1)
    assert first.prompt_tokens > 0
    for repeat in (second, fourth):
        assert (repeat.calls, repeat.prompt_tokens, repeat.cache_hits) == (0, 0, 3)
    assert judged_count(runtime, judge) == 4


def test_a_failed_call_leaves_the_rest_of_the_slice_stored_and_its_event_pending(
    tmp_path: Path, sqlite_url: str, redis_url: str, fake_llm: FakeLLM
) -> None:
    settings = slice_settings(tmp_path, sqlite_url, redis_url, fake_llm, judge_concurrency=1)
    runtime, pks = store(settings, [(f"question {i}", list(TEXTS)) for i in range(4)])
    judge = make_judge(settings, runtime.redis)
    fake_llm.set_fault("http_500", count=1)

    result = judging.judge_events(runtime, judge, pks)

    (failed,) = result.transient
    assert result.transient[failed].reason == "server_error"
    assert result.outcomes[failed] == "retry"
    assert {pk for pk, outcome in result.outcomes.items() if outcome == "judged"} == set(pks) - {
        failed
    }
    assert failed not in runs(runtime)
    assert judged_count(runtime, judge) == 3

    # Its retry judges it like any other event.
    assert judging.judge_event(runtime, judge, failed) == "judged"
    assert judged_count(runtime, judge) == 4


def test_a_score_stored_concurrently_stands_and_the_rest_of_the_slice_is_stored(
    tmp_path: Path, postgres_url: str, redis_url: str, fake_llm: FakeLLM
) -> None:
    """Two deliveries store the same event at once: PostgreSQL's unique key makes the slice's
    transaction fail; the slice then stores its events one by one and skips the one taken."""
    settings = slice_settings(tmp_path, postgres_url, redis_url, fake_llm)
    runtime, pks = store(settings, [(f"question {i}", list(TEXTS)) for i in range(3)])
    judge = make_judge(settings, runtime.redis)
    with session_scope(runtime.engine) as session:
        taken = load_many_for_judging(session, pks[:1])[0]
    theirs = judging_result(runtime.settings, EventWork(taken, "q", context_cache_key(taken)))
    blocked = threading.Event()

    with session_scope(runtime.engine) as other:
        # The other delivery's transaction holds the first event's rows, uncommitted...
        assert store_judging_many(other, judge.identity, [(taken, theirs)])

        def commit_once_the_slice_waits() -> None:
            # ...until the slice's insert waits on them; then it commits, and the insert fails.
            with session_scope(runtime.engine) as watcher:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not blocked.is_set():
                    waiting = watcher.execute(
                        text(
                            "SELECT count(*) FROM pg_stat_activity "
                            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                        )
                    ).scalar_one()
                    watcher.rollback()
                    if waiting:
                        blocked.set()
                    else:
                        time.sleep(0.02)
            other.commit()

        committer = threading.Thread(target=commit_once_the_slice_waits)
        committer.start()
        result = judging.judge_events(runtime, judge, pks)
        committer.join()

    assert blocked.is_set(), "the slice never waited on the other transaction"
    assert result.outcomes == {pks[0]: "already_judged", pks[1]: "judged", pks[2]: "judged"}
    assert sorted(runs(runtime)) == sorted(pks)


def test_a_partly_counted_slice_adds_only_its_uncounted_events(redis_url: str) -> None:
    """The summed export of a slice: markers already set (a redelivery after a crash between two
    slices sharing events) leave their events out; the rest is applied exactly once."""
    aggregates = Aggregates(redis.Redis.from_url(redis_url))
    aggregates.clear()
    aggregates.start_epoch(time.time())

    def delta(value: float) -> Delta:
        one = Delta()
        one.inc("events_judged", {"app": "shop", "judge": "j"})
        one.observe("measure_precision", {"app": "shop", "judge": "j"}, value)
        return one

    assert aggregates.add_many_once([("e1", delta(0.1)), ("e3", delta(0.3))]) == [True, True]
    spend = Delta()
    spend.inc("judge_app_calls", {"app": "shop", "judge": "j"}, 4)
    flags = aggregates.add_many_once(
        [("e1", delta(0.1)), ("e2", delta(0.2)), ("e3", delta(0.3)), ("e4", delta(0.9))], spend
    )
    assert flags == [False, True, False, True]
    values = aggregates.read()
    assert values[("events_judged", ("", "shop", "", "", "j", ""), "")] == 4
    assert values[("measure_precision", ("", "shop", "", "", "j", ""), "sum")] == pytest.approx(1.5)
    assert values[("judge_app_calls", ("", "shop", "j"), "")] == 4
    # Nothing new: nothing applied, however often it comes back.
    assert aggregates.add_many_once([("e2", delta(0.2)), ("e4", delta(0.9))]) == [False, False]
    assert aggregates.read()[("events_judged", ("", "shop", "", "", "j", ""), "")] == 4


@pytest.mark.postgres
def test_a_slice_sends_the_same_statements_whatever_its_size_on_postgresql(
    tmp_path: Path, postgres_url: str, redis_url: str, fake_llm: FakeLLM
) -> None:
    """Judgments, runs, label-cache rows and scores go as arrays, one INSERT per table: a slice
    of one event with one passage and a slice of 12 events with 3 passages each send the same
    statements (an executemany of N rows counts N: the server runs one INSERT per row)."""
    settings = slice_settings(tmp_path, postgres_url, redis_url, fake_llm, judge_concurrency=4)
    fake_llm.set_labels({(None, TEXTS[0]): 3, (None, TEXTS[1]): 1})
    runtime, pks = store(
        settings,
        [("lone question", [TEXTS[2]])] + [(f"question {i}", list(TEXTS)) for i in range(12)],
    )
    judge = make_judge(settings, runtime.redis)
    sent: list[str] = []

    def count(
        _conn: object,
        _cursor: object,
        statement: str,
        parameters: object,
        _context: object,
        executemany: bool,
    ) -> None:
        rows = len(parameters) if executemany and isinstance(parameters, list) else 1
        sent.extend([statement.split("(")[0].strip()] * rows)

    event.listen(runtime.engine, "before_cursor_execute", count)
    try:
        assert judging.judge_events(runtime, judge, pks[:1]).outcomes == {pks[0]: "judged"}
        lone = sorted(sent)
        sent.clear()
        assert judging.judge_events(runtime, judge, pks[1:]).outcomes == dict.fromkeys(
            pks[1:], "judged"
        )
        full = sorted(sent)
    finally:
        event.remove(runtime.engine, "before_cursor_execute", count)
    inserts = [statement for statement in full if statement.startswith("INSERT")]
    assert sorted(inserts) == [
        "INSERT INTO judge_runs",
        "INSERT INTO judgments",
        "INSERT INTO label_cache",
        "INSERT INTO scores",
    ]
    assert full == lone
    with session_scope(runtime.engine) as session:
        assert len(session.exec(select(Judgment)).all()) == 1 + 12 * 3
        assert len(session.exec(select(Score)).all()) == 13
