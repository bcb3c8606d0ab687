"""``/metrics``: the page Prometheus scrapes, from the shared aggregates read at scrape time.

The shared families (every family of ``service.telemetry.metrics.FAMILIES``) and the pipeline
gauges are written as exposition text directly (``service.telemetry.exposition``): they are
nearly all of a scrape's samples. The families computed elsewhere (``extra``: the judge's agreement
with gold labels, the budgets left) are few and stay prometheus_client objects, formatted by
``generate_latest`` and appended; their names are not among the shared ones, so no family appears
twice.

The page is the Prometheus text format only, whatever the ``Accept`` header; OpenMetrics is not
offered (it forbids the _sum of a histogram with negative bounds, which T and T_u have).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from service.telemetry.aggregates import COUNT, SUM, Aggregates
from service.telemetry.exposition import HistogramLayout, header, write_samples
from service.telemetry.metrics import EVENTS_PENDING, FAMILIES, OLDEST_PENDING_AGE, QUEUE_DEPTH


@dataclass(frozen=True)
class PipelineState:
    queue_depth: dict[str, int]
    pending_events: int
    oldest_pending_age_seconds: float


class _Families(Collector):
    """Hands already built families to ``generate_latest``, which only needs ``collect``."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


class MetricsPage:
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

        state = self.pipeline_state()
        out.append(header(QUEUE_DEPTH.full_name, QUEUE_DEPTH.help, "gauge"))
        write_samples(
            out,
            QUEUE_DEPTH.full_name,
            QUEUE_DEPTH.labels,
            (((queue,), count) for queue, count in state.queue_depth.items()),
        )
        for gauge, value in (
            (EVENTS_PENDING, state.pending_events),
            (OLDEST_PENDING_AGE, state.oldest_pending_age_seconds),
        ):
            out.append(header(gauge.full_name, gauge.help, "gauge"))
            write_samples(out, gauge.full_name, (), [((), value)])
        out.append(generate_latest(_Families(self.extra())).decode())
        return "".join(out).encode()
