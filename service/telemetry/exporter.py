"""``/metrics``: the page Prometheus scrapes, from the shared aggregates read at scrape time.

The shared families (every family of ``service.telemetry.metrics.FAMILIES``) are written as
exposition text directly (``service.telemetry.exposition``): they are nearly all of a scrape's
samples. The families computed at scrape time from state that lives elsewhere (the pipeline's
queues and pending events, the judge's agreement with gold labels, the budgets left) are few; each
source is a prometheus_client ``Collector``, registered once in the page's own registry, and
formatted by ``generate_latest`` after the shared ones. The registry also holds the shared names,
so a collector that would repeat one of them is refused when it is registered.

The page is the Prometheus text format only, whatever the ``Accept`` header; OpenMetrics is not
offered (it forbids the _sum of a histogram with negative bounds, which T and T_u have).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from service.telemetry.aggregates import COUNT, SUM, Aggregates
from service.telemetry.exposition import HistogramLayout, header, write_samples
from service.telemetry.metrics import EVENTS_PENDING, FAMILIES, OLDEST_PENDING_AGE, QUEUE_DEPTH


@dataclass(frozen=True)
class PipelineState:
    queue_depth: dict[str, int]  # the shared queues: every tenant's tasks wait in the same ones
    pending_events: dict[str, int]  # by tenant
    oldest_pending_age_seconds: dict[str, float]  # by tenant (0: nothing waits)


class PipelineGauges(Collector):
    """Queue depth, and per tenant the pending events and the oldest one's age, as ``read``
    finds them at scrape time."""

    def __init__(self, read: Callable[[], PipelineState]) -> None:
        self.read = read

    def describe(self) -> list[Metric]:
        return list(self._empty())

    def collect(self) -> list[Metric]:
        state = self.read()
        depth, pending, age = self._empty()
        for queue, count in state.queue_depth.items():
            depth.add_metric([queue], count)
        for tenant, count in state.pending_events.items():
            pending.add_metric([tenant], count)
        for tenant, seconds in state.oldest_pending_age_seconds.items():
            age.add_metric([tenant], seconds)
        return [depth, pending, age]

    @staticmethod
    def _empty() -> tuple[GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(
                QUEUE_DEPTH.full_name, QUEUE_DEPTH.help, labels=list(QUEUE_DEPTH.labels)
            ),
            GaugeMetricFamily(
                EVENTS_PENDING.full_name, EVENTS_PENDING.help, labels=list(EVENTS_PENDING.labels)
            ),
            GaugeMetricFamily(
                OLDEST_PENDING_AGE.full_name,
                OLDEST_PENDING_AGE.help,
                labels=list(OLDEST_PENDING_AGE.labels),
            ),
        )


class _SharedNames(Collector):
    """Describes the families the page writes itself and collects nothing: holding their names
    in the registry makes it refuse a collector that would write one of them again."""

    def describe(self) -> list[Metric]:
        return [Metric(family.full_name, family.help, family.kind) for family in FAMILIES.values()]

    def collect(self) -> list[Metric]:
        return []


class MetricsPage:
    def __init__(
        self,
        aggregates: Aggregates,
        collectors: Iterable[Collector] = (),
        before_scrape: Callable[[], None] = lambda: None,
    ) -> None:
        self.aggregates = aggregates
        self.before_scrape = before_scrape
        self.collectors = tuple(collectors)  # what a scrape computes, in the page's order
        # The families computed at scrape time, in the order given.
        self.computed = CollectorRegistry(auto_describe=True)
        self.computed.register(_SharedNames())
        for collector in self.collectors:
            self.computed.register(collector)
        # Histograms are built by hand rather than with prometheus_client's, which drops _sum and
        # _count when a bucket bound is negative (an OpenMetrics rule); T and T_u go negative,
        # and their rolling means need rate(_sum) / rate(_count) like every other measure.
        self._histograms = {
            name: HistogramLayout.of(family.full_name, family.labels, family.buckets)
            for name, family in FAMILIES.items()
            if family.kind == "histogram"
        }
        self._headers = {
            name: header(
                f"{family.full_name}_total" if family.kind == "counter" else family.full_name,
                family.help,
                family.kind,
            )
            for name, family in FAMILIES.items()
        }

    def render(self) -> bytes:
        """The whole page, in the Prometheus text format (``exposition.CONTENT_TYPE``)."""
        self.before_scrape()
        series = self.aggregates.read_series()
        out: list[str] = []
        formatted: dict[float, str] = {}
        for name, family in FAMILIES.items():
            by_labels = sorted(series.get(name, {}).items())
            if family.kind == "counter":
                out.append(self._headers[name])
                write_samples(
                    out,
                    f"{family.full_name}_total",
                    family.labels,
                    ((labels, values[0]) for labels, values in by_labels),
                )
            elif family.kind == "histogram":
                out.append(self._headers[name])
                layout = self._histograms[name]
                for labels, values in by_labels:
                    layout.write(out, labels, values[:COUNT], values[COUNT], values[SUM], formatted)

        out.append(generate_latest(self.computed).decode())
        return "".join(out).encode()
