"""``/metrics``: a Prometheus collector that reads the shared aggregates at scrape time."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from service.aggregates import Aggregates
from service.metrics import EVENTS_PENDING, FAMILIES, OLDEST_PENDING_AGE, QUEUE_DEPTH, Family


@dataclass(frozen=True)
class PipelineState:
    queue_depth: dict[str, int]
    pending_events: int
    oldest_pending_age_seconds: float


class SharedCollector(Collector):
    def __init__(
        self,
        aggregates: Aggregates,
        pipeline_state: Callable[[], PipelineState],
        before_scrape: Callable[[], None] = lambda: None,
        extra: Callable[[], Iterable[Metric]] = lambda: (),
    ) -> None:
        self.aggregates = aggregates
        self.pipeline_state = pipeline_state
        self.before_scrape = before_scrape
        # Families computed elsewhere at scrape time (the judge's agreement with gold labels).
        self.extra = extra

    def collect(self) -> Iterator[Metric]:
        self.before_scrape()
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
                yield _histogram(family, series)

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
        yield from self.extra()


def _histogram(family: Family, series: dict[tuple[str, ...], dict[str, float]]) -> Metric:
    # Built by hand rather than with HistogramMetricFamily, which drops _sum and _count when a
    # bucket bound is negative (an OpenMetrics rule); T and T_u go negative, and their rolling
    # means need rate(_sum) / rate(_count) like every other measure.
    metric = Metric(family.full_name, family.help, "histogram")
    for labels, parts in sorted(series.items()):
        base = dict(zip(family.labels, labels, strict=True))
        cumulative = 0.0
        for index, bound in enumerate(family.buckets):
            cumulative += parts.get(f"b{index}", 0.0)
            metric.add_sample(
                f"{family.full_name}_bucket", {**base, "le": _bound(bound)}, cumulative
            )
        count = parts.get("count", 0.0)
        metric.add_sample(f"{family.full_name}_bucket", {**base, "le": "+Inf"}, count)
        metric.add_sample(f"{family.full_name}_count", base, count)
        metric.add_sample(f"{family.full_name}_sum", base, parts.get("sum", 0.0))
    return metric


def _bound(bound: float) -> str:
    return repr(float(bound))


def build_registry(collector: SharedCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry
