"""The families /metrics computes at scrape time come from prometheus_client Collectors that the
page registers once: each describes exactly what it collects, none may repeat a family the page
writes itself, and the served page carries each of them once, after the shared families."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from service.analysis.gauges import CachedAgreementGauges, CachedCalibrationGauges
from service.api.app import create_app
from service.config.settings import Settings
from service.spend.budget import Budget, BudgetGauges, Reservation
from service.store.engine import make_engine
from service.telemetry.aggregates import Aggregates
from service.telemetry.exporter import MetricsPage, PipelineGauges, PipelineState
from service.telemetry.metrics import FAMILIES
from tests.support.environment import make_settings

STATE = PipelineState(
    queue_depth={"judge": 2, "judge.urgent": 1},
    pending_events={"acme": 3, "default": 0},
    oldest_pending_age_seconds={"acme": 4.5, "default": 0.0},
)
COMPUTED = [
    "retrieval_monitor_queue_depth",
    "retrieval_monitor_events_pending",
    "retrieval_monitor_oldest_pending_event_age_seconds",
    "retrieval_monitor_judge_gold_kappa",
    "retrieval_monitor_judge_gold_precision",
    "retrieval_monitor_judge_gold_recall",
    "retrieval_monitor_judge_gold_passages",
    "retrieval_monitor_gold_labeller_kappa",
    "retrieval_monitor_gold_labeller_shared_events",
    "retrieval_monitor_gold_labeller_disagreements",
    "retrieval_monitor_judge_budget_remaining",
]


class _Fixed(Collector):
    def __init__(self, family: Metric) -> None:
        self.family = family

    def describe(self) -> list[Metric]:
        return [self.family]

    def collect(self) -> list[Metric]:
        return [self.family]


def _shape(families: list[Metric]) -> list[tuple[str, str, str]]:
    return [(f.name, f.type, f.documentation) for f in families]


def test_each_collector_describes_what_it_collects(
    tmp_path: Path, settings: Settings, redis_url: str
) -> None:
    capped = make_settings(
        tmp_path,
        settings.database_url,
        redis_url,
        budget_overrides={"bot": {"tokens_per_day": 5000}},
    )
    held = Budget(redis.Redis.from_url(redis_url), capped).reserve("default", "bot", "m", 100, 0)
    assert isinstance(held, Reservation)
    engine = make_engine(settings.database_url)
    collectors: list[
        PipelineGauges | CachedCalibrationGauges | CachedAgreementGauges | BudgetGauges
    ] = [
        PipelineGauges(lambda: STATE),
        CachedCalibrationGauges(engine),
        BudgetGauges(redis.Redis.from_url(redis_url), capped),
        CachedAgreementGauges(engine),
    ]
    try:
        for collector in collectors:
            described = list(collector.describe())
            collected = list(collector.collect())
            assert _shape(described) == _shape(collected), type(collector).__name__
            assert all(not family.samples for family in described)
    finally:
        engine.dispose()
    depth, pending, age = PipelineGauges(lambda: STATE).collect()
    assert {s.labels["queue"]: s.value for s in depth.samples} == {"judge": 2, "judge.urgent": 1}
    assert {s.labels["tenant"]: s.value for s in pending.samples} == {"acme": 3, "default": 0}
    assert {s.labels["tenant"]: s.value for s in age.samples} == {"acme": 4.5, "default": 0}
    (budget,) = collectors[2].collect()
    assert [(s.labels, s.value) for s in budget.samples] == [
        ({"tenant": "default", "app": "bot", "window": "tokens_per_day"}, 4900)
    ]


@pytest.mark.parametrize(
    "family",
    [
        CounterMetricFamily(FAMILIES["events_rejected"].full_name, "again", labels=["reason"]),
        GaugeMetricFamily(f"{FAMILIES['measure_t'].full_name}_sum", "a histogram's own sample"),
    ],
    ids=["counter", "histogram-sample"],
)
def test_a_collector_may_not_repeat_a_family_the_page_writes(
    redis_url: str, family: Metric
) -> None:
    aggregates = Aggregates(redis.Redis.from_url(redis_url))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        MetricsPage(aggregates, [_Fixed(family)])
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        MetricsPage(aggregates, [PipelineGauges(lambda: STATE), PipelineGauges(lambda: STATE)])


def test_the_served_page_has_each_computed_family_once_after_the_shared_ones(
    settings: Settings,
) -> None:
    with TestClient(create_app(settings)) as client:
        answer = client.get("/metrics")
    assert answer.status_code == 200
    names = [family.name for family in text_string_to_metric_families(answer.text)]
    shared = [family.full_name for family in FAMILIES.values()]
    assert names == shared + COMPUTED
