"""Judge budgets in Redis: reserve before a call, settle after, shared by parallel workers."""

from __future__ import annotations

import multiprocessing
import random
import time
from typing import Any

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session, select

from service.api.app import create_app
from service.config.settings import Settings
from service.spend.budget import (
    Budget,
    BudgetGauges,
    Limits,
    Refusal,
    Reservation,
    budgeted_apps,
    configured_owners,
    estimate_prompt_tokens,
    limits_for,
    price_for,
    spend_delta,
)
from service.store.models import Event
from service.telemetry.cardinality import LabelSet, LabelSetCap
from service.wiring.runtime import Runtime
from tests.support.fake_llm.fixture import FakeLLM
from tests.support.helpers import bearer, make_event
from tests.support.live import WorkerFactory, processes_that_judged, wait_for
from tests.support.tenants import add_key

ESTIMATE = 100  # tokens reserved per call; the real use is at most this
LIMIT = 5_000
NOW = 1_800_000_000.0  # a fixed instant, so a test never straddles an hour
# The judge serves a call the worker gave up on (its timeout) and counts its tokens, which no
# reply brings back to the budget: tests comparing the budget with the judge's own count give
# the calls all the time a loaded machine needs.
NO_TIMEOUT = 300.0


def budget_settings(**extra: object) -> Settings:
    values: dict[str, object] = {
        "budget_tokens_per_hour": LIMIT,
        "judge_prices": {"m": {"prompt_per_1k": 0.5, "completion_per_1k": 1.5}},
    }
    values.update(extra)
    return Settings(**values)  # type: ignore[arg-type]


def _worker(url: str, seed: int, results: multiprocessing.Queue, start: Any) -> None:  # type: ignore[type-arg]
    """One worker process: call the judge while the budget lets it; report tokens really used."""
    budget = Budget(redis.Redis.from_url(url), budget_settings())
    rng = random.Random(seed)
    used = calls = 0
    start.wait(timeout=30)  # all processes begin together, so they really compete
    while True:
        held = budget.reserve("default", "bot", "m", ESTIMATE - 20, 20, now=NOW)
        if isinstance(held, Refusal):
            break
        actual = rng.randint(30, ESTIMATE)
        time.sleep(0.001)  # the judge call, during which the others reserve too
        budget.settle(held, actual - 10, 10)
        used += actual
        calls += 1
    results.put((used, calls))


def test_parallel_workers_overshoot_by_at_most_one_call(redis_url: str) -> None:
    context = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = context.Queue()  # type: ignore[type-arg]
    start = context.Event()
    workers = [
        context.Process(target=_worker, args=(redis_url, i, results, start)) for i in range(6)
    ]
    for worker in workers:
        worker.start()
    start.set()
    reports = [results.get(timeout=30) for _ in workers]
    for worker in workers:
        worker.join(timeout=10)
    used = sum(u for u, _ in reports)
    calls = sum(c for _, c in reports)
    spent = Budget(redis.Redis.from_url(redis_url), budget_settings()).spent(
        "default", "bot", now=NOW
    )
    # Redis holds exactly what the workers really used, once every reservation is settled.
    assert spent["tokens_per_hour"] == pytest.approx(used)
    assert spent["tokens_per_day"] == pytest.approx(used)
    # Reserved totals can exceed the limit by one reservation; real use is at most that.
    assert used <= LIMIT + ESTIMATE
    # The budget was really used, not refused early: every admitted call reserved <= 100.
    assert calls >= LIMIT // ESTIMATE
    assert sum(1 for _, c in reports if c > 0) >= 2  # the workers did run side by side


def test_refusal_names_the_window_and_when_it_resets(redis_url: str) -> None:
    budget = Budget(
        redis.Redis.from_url(redis_url),
        budget_settings(budget_tokens_per_hour=0, budget_dollars_per_day=10),
    )
    held = budget.reserve("default", "bot", "m", 5_000, 2_000, now=NOW)  # $2.50 + $3.00
    assert isinstance(held, Reservation)
    assert held.dollars == pytest.approx(5.5)
    assert isinstance(budget.reserve("default", "bot", "m", 5_000, 2_000, now=NOW), Reservation)
    refused = budget.reserve("default", "bot", "m", 1, 1, now=NOW + 5)
    assert isinstance(refused, Refusal)
    assert refused.window == "dollars_per_day"
    assert refused.retry_after_seconds == pytest.approx(86400 - (NOW + 5) % 86400)
    # Another app and the next day draw on budgets of their own.
    assert isinstance(budget.reserve("default", "other", "m", 1, 1, now=NOW), Reservation)
    assert isinstance(budget.reserve("default", "bot", "m", 1, 1, now=NOW + 86400), Reservation)


def test_settle_refunds_the_estimate_and_remaining_shows_it(redis_url: str) -> None:
    budget = Budget(redis.Redis.from_url(redis_url), budget_settings())
    held = budget.reserve("default", "bot", "m", 900, 100, now=NOW)
    assert isinstance(held, Reservation)
    assert budget.remaining("default", "bot", now=NOW)["tokens_per_hour"] == LIMIT - 1000
    budget.settle(held, 300, 50)
    remaining = budget.remaining("default", "bot", now=NOW)
    assert remaining["tokens_per_hour"] == LIMIT - 350
    assert remaining["tokens_per_day"] is None  # no cap set
    dollars = budget.spent("default", "bot", now=NOW)["dollars_per_hour"]
    assert dollars == pytest.approx((300 * 0.5 + 50 * 1.5) / 1000)


def test_an_unlimited_app_is_never_refused(redis_url: str) -> None:
    budget = Budget(redis.Redis.from_url(redis_url), budget_settings(budget_tokens_per_hour=0))
    for _ in range(50):
        assert isinstance(budget.reserve("default", "bot", "m", 1e6, 1e6, now=NOW), Reservation)


def test_overrides_prices_and_estimates() -> None:
    settings = budget_settings(
        budget_tokens_per_day=10, budget_overrides={"bot": {"tokens_per_hour": 7, "bogus": 1}}
    )
    assert limits_for("default", "bot", settings) == Limits(7, 10, 0, 0)
    assert limits_for("default", "other", settings) == Limits(LIMIT, 10, 0, 0)
    assert not limits_for("default", "other", settings).unlimited
    assert price_for("unknown", settings.judge_prices).dollars(1000, 1000) == 0.0
    assert price_for("m", settings.judge_prices).dollars(1000, 1000) == pytest.approx(2.0)
    assert estimate_prompt_tokens(["a" * 400, "b" * 401], 600) == 600 + 201


def test_spend_delta_carries_app_and_cost() -> None:
    delta = spend_delta(
        "default", "bot", "llm", price_for("m", budget_settings().judge_prices), 1, 1000, 100
    )
    values = dict(delta.values)
    assert values['["judge_app_calls",["default","bot","llm"],""]'] == 1
    assert values['["judge_app_tokens",["default","bot","llm","prompt"],""]'] == 1000
    assert values['["judge_cost_dollars",["default","bot","llm"],""]'] == pytest.approx(0.65)


def _states(settings: Settings) -> dict[str, tuple[str, str | None]]:
    with Session(Runtime(settings).engine) as session:
        return {e.event_id: (e.status, e.skip_reason) for e in session.exec(select(Event)).all()}


def _metric(
    client: TestClient, name: str, headers: dict[str, str] | None = None, **labels: str
) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(client.get("/metrics", headers=headers).text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.mark.parametrize("policy", ["skip", "wait"])
def test_two_worker_processes_share_one_budget(
    llm_settings: Settings, worker_factory: WorkerFactory, fake_llm: FakeLLM, policy: str
) -> None:
    limit = 1500
    settings = llm_settings.model_copy(
        update={
            "budget_tokens_per_day": limit,
            "budget_policy": policy,
            "judge_max_tokens": 200,
            "judge_slice_events": 1,  # a task per event, so that both processes get some
            "judge_timeout_seconds": NO_TIMEOUT,
        }
    )
    fake_llm.reset()
    fake_llm.set_labels(default_grade=2)
    events = [make_event(f"ev-{i}", n=3, query=f"distinct question {i}") for i in range(16)]
    with TestClient(create_app(settings)) as client:
        worker = worker_factory(settings, concurrency=2).start()
        assert client.post("/v1/events/batch", json={"events": events}).status_code == 200
        if policy == "skip":

            def settled() -> bool:
                return all(s != "pending" for s, _ in _states(settings).values())

        else:

            def settled() -> bool:
                deferred = _metric(client, "retrieval_monitor_events_deferred_total")
                judged = sum(s == "judged" for s, _ in _states(settings).values())
                return judged + deferred >= len(events)

        wait_for(settled, timeout=90)

        def spend_exported() -> bool:
            # The last settle and its counters land after the status that ``settled`` reads.
            stats = fake_llm.stats()
            used = float(stats["prompt_tokens"] + stats["completion_tokens"])
            return _metric(client, "retrieval_monitor_judge_app_tokens_total", app="shop") == used

        wait_for(spend_exported, timeout=30)
        stats = fake_llm.stats()
        used = stats["prompt_tokens"] + stats["completion_tokens"]
        app_tokens = _metric(client, "retrieval_monitor_judge_app_tokens_total", app="shop")
        skipped = _metric(client, "retrieval_monitor_events_skipped_total", reason="budget")
        deferred = _metric(client, "retrieval_monitor_events_deferred_total", reason="budget")
    # Both pool processes called the judge or met the spent budget: they really competed.
    assert len(processes_that_judged([worker])) == 2, processes_that_judged([worker])
    spent = Budget(redis.Redis.from_url(settings.redis_url), settings).spent("default", "shop")
    states = _states(settings)
    judged = sum(s == "judged" for s, _ in states.values())
    # The budget holds exactly what the judge reports it used, and so does the figure.
    assert spent["tokens_per_day"] == pytest.approx(used)
    assert app_tokens == pytest.approx(used)
    # At most one reservation (prompt estimate + 200) past the limit, for both workers together.
    assert limit <= used <= limit + 1200, used
    assert 0 < judged < len(events)
    if policy == "skip":
        assert sum(r == "budget" for _, r in states.values()) == skipped == len(events) - judged
        assert deferred == 0
    else:
        assert sum(s == "pending" for s, _ in states.values()) == len(events) - judged
        assert deferred >= len(events) - judged
        assert skipped == 0


def test_budget_gauges_report_what_is_left_per_tenant_app_and_capped_window(
    redis_url: str,
) -> None:
    settings = budget_settings(
        budget_overrides={"quiet": {"dollars_per_day": 3}},
        budget_tenant_overrides={"acme": {"bot": {"tokens_per_hour": 900}}},
    )
    store = redis.Redis.from_url(redis_url)
    cap = LabelSetCap(store, settings.max_label_sets_per_tenant, settings.max_label_sets)
    for tenant in ("default", "acme"):
        assert cap.admits(LabelSet(tenant, "bot", "bm25", ""))
    budget = Budget(store, settings)
    for tenant, tokens in (("default", 400), ("acme", 100)):
        held = budget.reserve(tenant, "bot", "m", 1000, 0)
        assert isinstance(held, Reservation)
        budget.settle(held, tokens, 0)
    # Spent under an app name no admitted label set carries: budgeted, but not a series.
    assert isinstance(budget.reserve("acme", "unadmitted", "m", 10, 0), Reservation)
    samples = {
        (s.labels["tenant"], s.labels["app"], s.labels["window"]): s.value
        for family in BudgetGauges(store, settings).collect()
        for s in family.samples
    }
    assert samples == {
        ("default", "bot", "tokens_per_hour"): LIMIT - 400,
        ("acme", "bot", "tokens_per_hour"): 900 - 100,
        ("default", "quiet", "tokens_per_hour"): LIMIT,
        ("default", "quiet", "dollars_per_day"): 3,
    }


def test_tenants_sharing_an_app_name_spend_budgets_of_their_own(redis_url: str) -> None:
    settings = budget_settings(
        budget_overrides={"quiet": {"tokens_per_hour": 7}},
        budget_tenant_overrides={"globex": {"quiet": {"tokens_per_hour": 9}}},
    )
    budget = Budget(redis.Redis.from_url(redis_url), settings)
    while isinstance(budget.reserve("acme", "bot", "m", 1000, 0, now=NOW), Reservation):
        pass
    assert budget.remaining("acme", "bot", now=NOW)["tokens_per_hour"] == 0
    # Another tenant's "bot" is untouched: nothing spent, nothing refused.
    assert budget.spent("globex", "bot", now=NOW)["tokens_per_hour"] == 0
    assert isinstance(budget.reserve("globex", "bot", "m", 1000, 0, now=NOW), Reservation)
    # The per-app override sets the limits of that app name in every tenant, and a tenant's own
    # override wins over it.
    assert limits_for("default", "quiet", settings).tokens_per_hour == 7
    assert limits_for("acme", "quiet", settings).tokens_per_hour == 7
    assert limits_for("globex", "quiet", settings).tokens_per_hour == 9
    assert limits_for("acme", "bot", settings).tokens_per_hour == LIMIT
    # Names with the key's separator and glob characters cannot collide, and the day's spenders
    # read back as exactly the pairs that spent.
    assert budget.keys("a:b", "c", NOW) != budget.keys("a", "b:c", NOW)
    for tenant, app in (("a:b*", "[c]"), ("a", "b*:[c]")):
        assert isinstance(budget.reserve(tenant, app, "m", 10, 0, now=NOW), Reservation)
    spenders = budgeted_apps(budget.redis, settings, NOW) - configured_owners(settings)
    assert spenders == {("acme", "bot"), ("globex", "bot"), ("a:b*", "[c]"), ("a", "b*:[c]")}


def test_a_tenant_spending_its_budget_does_not_refuse_another_tenants_same_app(
    llm_settings: Settings, worker_factory: WorkerFactory, fake_llm: FakeLLM
) -> None:
    limit = 1500
    settings = llm_settings.model_copy(
        update={
            "auth_required": True,
            "budget_tokens_per_day": limit,
            "budget_policy": "skip",
            "judge_max_tokens": 200,
            "judge_timeout_seconds": NO_TIMEOUT,
        }
    )
    fake_llm.reset()
    fake_llm.set_labels(default_grade=2)
    acme, globex = add_key(settings, "acme"), add_key(settings, "globex")
    admin = add_key(settings, "ops", admin=True)
    worker_factory(settings).start()
    with TestClient(create_app(settings)) as client:
        # acme spends the whole day of its "shop" budget.
        flood = [make_event(f"a-{i}", n=3, query=f"acme question {i}") for i in range(16)]
        sent = client.post("/v1/events/batch", json={"events": flood}, headers=bearer(acme))
        assert sent.status_code == 200
        wait_for(lambda: all(s != "pending" for s, _ in _states(settings).values()), timeout=90)
        acme_states = _states(settings)
        assert any(reason == "budget" for _, reason in acme_states.values())
        acme_used = sum(fake_llm.stats()[k] for k in ("prompt_tokens", "completion_tokens"))

        # globex sends under the same app name: judged in full, its budget its own.
        mine = [make_event(f"g-{i}", n=3, query=f"globex question {i}") for i in range(2)]
        sent = client.post("/v1/events/batch", json={"events": mine}, headers=bearer(globex))
        assert sent.status_code == 200

        def globex_settled() -> bool:
            states = _states(settings)
            return all(states[f"g-{i}"][0] != "pending" for i in range(2))

        wait_for(globex_settled, timeout=60)
        states = _states(settings)
        wait_for(
            lambda: (
                _metric(
                    client,
                    "retrieval_monitor_judge_app_calls_total",
                    headers=bearer(admin),
                    tenant="globex",
                )
                == 2
            ),
            timeout=30,
        )
        used = sum(fake_llm.stats()[k] for k in ("prompt_tokens", "completion_tokens"))
        left = {
            tenant: _metric(
                client,
                "retrieval_monitor_judge_budget_remaining",
                headers=bearer(admin),
                tenant=tenant,
                app="shop",
                window="tokens_per_day",
            )
            for tenant in ("acme", "globex")
        }
    assert [states[f"g-{i}"] for i in range(2)] == [("judged", None)] * 2
    store = redis.Redis.from_url(settings.redis_url)
    spent = Budget(store, settings)
    assert spent.spent("acme", "shop")["tokens_per_day"] == pytest.approx(acme_used)
    assert spent.spent("globex", "shop")["tokens_per_day"] == pytest.approx(used - acme_used)
    assert left["acme"] == 0
    assert left["globex"] == pytest.approx(limit - (used - acme_used))
    assert 0 < left["globex"] < limit


def test_events_deferred_by_a_spent_budget_are_judged_once_the_window_resets(
    llm_settings: Settings, worker_factory: WorkerFactory, fake_llm: FakeLLM
) -> None:
    settings = llm_settings.model_copy(
        update={
            "budget_tokens_per_day": 1500,
            "budget_policy": "wait",
            "judge_max_tokens": 200,
            "pending_requeue_seconds": 1,
            "sweep_interval_seconds": 0.5,
        }
    )
    fake_llm.set_labels(default_grade=2)
    events = [make_event(f"ev-{i}", n=3, query=f"distinct question {i}") for i in range(16)]
    worker_factory(settings, concurrency=2, with_scheduler=True).start()
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/events/batch", json={"events": events}).status_code == 200

        def judged() -> int:
            return sum(s == "judged" for s, _ in _states(settings).values())

        def spent_and_deferred() -> bool:
            deferred = _metric(client, "retrieval_monitor_events_deferred_total", reason="budget")
            return deferred > 0 and judged() + deferred >= len(events)

        wait_for(spent_and_deferred, timeout=90)
        held_back = len(events) - judged()
        assert held_back > 0
        assert all(r is None for _, r in _states(settings).values())  # none skipped
        calls_before = fake_llm.stats()["calls"]
        # The day turns: the window's counters start again from nothing, and the deferred
        # events come back until the new window is spent too. Day after day, all get judged.
        store = redis.Redis.from_url(settings.redis_url)
        budget = Budget(store, settings)
        while (before := judged()) < len(events):
            store.delete(*budget.keys("default", "shop", time.time()))
            wait_for(lambda: judged() > before, timeout=60)
    # Each deferred event cost one call, made after the reset; none was judged twice.
    assert fake_llm.stats()["calls"] == calls_before + held_back
