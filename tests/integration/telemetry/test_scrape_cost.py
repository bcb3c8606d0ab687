"""A scrape's Redis work does not grow with what Redis holds.

Redis keeps keys that grow with the events (one once-only export marker per judged event, the
spend counters of every day and hour): a scrape that walked the keyspace (a SCAN for today's
spenders did) took 0.3 s at 300,000 events and kept growing. The page is built here by the API's
own builder (``AppState.build``), so every collector a scrape runs, today's and any added later,
is covered: its Redis commands are recorded on a small keyspace and again after thousands of such
keys were added, and must be the same.

Tests ``service.api.scrape`` and ``service.http.state``.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

import redis
from sqlalchemy import Engine, event

from service.analysis.gauges import _CachedGauges
from service.api import scrape
from service.config.settings import Settings
from service.contract.schemas import EventIn
from service.http.state import AppState
from service.primitives.clock import utcnow
from service.spend.budget import Budget, Reservation, window_keys
from service.store import events as event_store
from service.store import gold as gold_store
from service.store.engine import make_engine, session_scope
from service.telemetry.aggregates import Delta
from service.telemetry.cardinality import LabelSet
from service.wiring.runtime import Runtime
from tests.support.environment import make_settings
from tests.support.helpers import make_event
from tests.support.recording_redis import RecordingRedis

GROWN_KEYS = 5_000


def _commands_of_one_scrape(state: AppState, client: RecordingRedis) -> Counter[str]:
    client.sent.clear()
    state.metrics_page.render()
    return Counter(client.sent)


def test_a_scrape_sends_the_same_redis_commands_however_many_keys_redis_holds(
    settings: Settings, tmp_path: Any
) -> None:
    settings = make_settings(
        tmp_path,
        settings.database_url,
        settings.redis_url,
        budget_tokens_per_day=1_000_000,
        judge_prices={"m": {"prompt_per_1k": 0.5, "completion_per_1k": 1.5}},
    )
    client = RecordingRedis(connection_pool=redis.ConnectionPool.from_url(settings.redis_url))
    runtime = Runtime(settings)
    runtime.__dict__["redis"] = client  # every part of the page reads Redis through it
    state = AppState.build(runtime, scrape.before_scrape)
    try:
        # Something in every kind of family: counters, a spender today, a rebuilt epoch.
        runtime.aggregates.start_epoch(0.0)
        delta = Delta()
        delta.inc("events_accepted", {"app": "a", "retriever": "r", "environment": ""})
        runtime.aggregates.add_once("event:1", delta)
        assert runtime.aggregates.cap is not None
        assert runtime.aggregates.cap.admits(LabelSet("default", "a", "r", ""))
        budget = Budget(client, settings)
        assert isinstance(budget.reserve("default", "a", "m", 100, 10), Reservation)
        state.metrics_page.render()  # loads scripts and fills the page's caches

        small = _commands_of_one_scrape(state, client)
        page = state.metrics_page.render().decode()
        assert 'retrieval_monitor_events_accepted_total{app="a"' in page
        assert 'retrieval_monitor_judge_budget_remaining{app="a"' in page

        # What grows with the events: export markers, and spend counters of past days.
        with client.pipeline(transaction=False) as pipe:
            for n in range(GROWN_KEYS):
                pipe.set(f"rm:metrics:done:event:{n + 2}", 1)
                pipe.set(window_keys("default", f"app{n}", 86400.0 * (n % 30))[1], 1)
            pipe.execute()
        assert client.dbsize() >= 2 * GROWN_KEYS

        grown = _commands_of_one_scrape(state, client)
        assert grown == small, f"a scrape's commands grew with the keyspace: {small} -> {grown}"
        assert not {"SCAN", "KEYS"} & set(grown)
    finally:
        state.ingestor.close()
        client.close()


# Collectors whose database read still grows with the events of their window, each with why.
# Listed so a gap is stated where it is checked: an entry whose read stops growing fails too.
READS_THAT_GROW: dict[str, str] = {}
PLAIN_EVENTS = 2_000


def _sqlite_steps(engine: Engine) -> list[int]:
    """Counts every SQLite virtual-machine instruction the engine's connections run, in [0]."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0  # go on

    def instrument(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.set_progress_handler(count, 1)

    event.listen(engine, "connect", instrument)
    return steps


def _steps_of_each_collector(state: AppState, steps: list[int]) -> dict[str, int]:
    spent: dict[str, int] = {}
    for collector in state.metrics_page.collectors:
        if isinstance(collector, _CachedGauges):
            collector.expire()
        before = steps[0]
        collector.collect()
        spent[type(collector).__name__] = steps[0] - before
    return spent


def _steps_after_plain_events(
    engine: Engine, state: AppState, steps: list[int], part: int, now: datetime
) -> dict[str, int]:
    """Each collector's instructions once another ``PLAIN_EVENTS`` judged events joined."""
    plain = [
        (f"plain-{part}-{n}", EventIn.model_validate(make_event(f"plain-{part}-{n}")))
        for n in range(PLAIN_EVENTS)
    ]
    skipped = {event_id: event_store.InitialState("unsampled") for event_id, _ in plain}
    with session_scope(engine) as session:
        event_store.insert_events(session, "default", plain, now, skipped)
        session.commit()
    return _steps_of_each_collector(state, steps)


def test_a_scrape_reads_the_same_rows_however_many_events_its_windows_hold(
    settings: Settings,
) -> None:
    """Each collector's database read, counted in SQLite instructions (deterministic, unlike
    time), on a database with a few gold, labelled and pending events, then after thousands of
    plain judged events joined the same windows, and after as many more: a read that visits the
    rows of a window rather than the few it reports grows with the traffic."""
    runtime = Runtime(settings)
    engine = make_engine(settings.database_url)
    steps = _sqlite_steps(engine)
    runtime.__dict__["engine"] = engine
    state = AppState.build(runtime, scrape.before_scrape)
    now = utcnow()
    try:
        with session_scope(engine) as session:
            named = [
                ("gold", EventIn.model_validate(make_event("gold", gold_passage_ids=["d1"]))),
                ("labelled", EventIn.model_validate(make_event("labelled"))),
                ("pending", EventIn.model_validate(make_event("pending"))),
            ]
            stored = event_store.insert_events(session, "default", named, now)
            labelled = stored[1].pk
            assert labelled is not None
            for labeller, outcome in (("ann", "answered"), ("bob", "not_in_corpus")):
                gold_store.save_label(
                    session,
                    gold_store.LabelRow(
                        labelled, labeller, labeller, outcome, ("d1",), None, None, now
                    ),
                )
            session.commit()
        few = _steps_of_each_collector(state, steps)
        page = state.metrics_page.render().decode()
        assert 'retrieval_monitor_events_pending{tenant="default"} 3.0' in page
        assert 'retrieval_monitor_gold_labeller_shared_events{tenant="default"} 1.0' in page
        assert 'retrieval_monitor_gold_labeller_disagreements{tenant="default"} 1.0' in page

        # Two sizes of plain traffic: a read that visits the window's rows costs more at the
        # second (the first only moves where the indexes' ranges end).
        spent = [_steps_after_plain_events(engine, state, steps, n, now) for n in (1, 2)]
    finally:
        state.ingestor.close()
        engine.dispose()

    fewer, more = spent
    assert set(few) == set(fewer) == {type(c).__name__ for c in state.metrics_page.collectors}
    assert set(READS_THAT_GROW) <= set(few)
    grew = {name for name in few if more[name] != fewer[name]}
    assert grew == set(READS_THAT_GROW), f"instructions per collector: {few}, {fewer}, {more}"
