"""``/metrics``: a Prometheus collector that reads the shared aggregates at scrape time."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from service.aggregates import Aggregates
from service.metrics import EVENTS_PENDING, FAMILIES, OLDEST_PENDING_AGE, QUEUE_DEPTH


@dataclass(frozen=True)
class PipelineState:
    queue_depth: dict[str, int]
    pending_events: int
    oldest_pending_age_seconds: float


class SharedCollector(Collector):
    def __init__(self, aggregates: Aggregates, pipeline_state: Callable[[], PipelineState]) -> None:
        self.aggregates = aggregates
        self.pipeline_state = pipeline_state

    def collect(self) -> Iterator[Metric]:
        values = self.aggregates.read()
        by_family: dict[str, dict[tuple[str, ...], dict[str, float]]] = defaultdict(
            lambda: defaultdict(dict)
        )
        for (name, labels, part), value in values.items():
            by_family[name][labels][part] = value

        for family_name, family in FAMILIES.items():
            series = by_family.get(family_name, {})
            if family.kind == "counter":
                counter = CounterMetricFamily(family.full_name, family.help, labels=family.labels)
                for labels, parts in sorted(series.items()):
                    counter.add_metric(list(labels), parts.get("", 0.0))
                yield counter
            elif family.kind == "histogram":
                histogram = HistogramMetricFamily(
                    family.full_name, family.help, labels=family.labels
                )
                for labels, parts in sorted(series.items()):
                    cumulative = 0.0
                    buckets: list[tuple[str, float]] = []
                    for index, bound in enumerate(family.buckets):
                        cumulative += parts.get(f"b{index}", 0.0)
                        buckets.append((_bound(bound), cumulative))
                    buckets.append(("+Inf", parts.get("count", 0.0)))
                    histogram.add_metric(list(labels), buckets, parts.get("sum", 0.0))
                yield histogram

        state = self.pipeline_state()
        depth = GaugeMetricFamily(QUEUE_DEPTH.full_name, QUEUE_DEPTH.help, labels=["queue"])
        for queue, count in state.queue_depth.items():
            depth.add_metric([queue], count)
        yield depth
        yield GaugeMetricFamily(
            EVENTS_PENDING.full_name, EVENTS_PENDING.help, value=state.pending_events
        )
        yield GaugeMetricFamily(
            OLDEST_PENDING_AGE.full_name,
            OLDEST_PENDING_AGE.help,
            value=state.oldest_pending_age_seconds,
        )


def _bound(bound: float) -> str:
    return repr(float(bound))


def build_registry(collector: SharedCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
