"""/metrics writes the exposition text itself; prometheus_client is the outside reference.

The reference rendering below builds prometheus_client's own family objects from the raw
aggregates (``Aggregates.read``) and formats them with ``generate_latest``. The page must parse
to exactly the same families and samples, and is in fact the same text byte for byte. promtool,
Prometheus's own linter, checks a scrape of the real app served over HTTP.

Tests ``service.telemetry.exporter`` and ``service.telemetry.aggregates``.
"""

from __future__ import annotations

import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

import httpx
import redis
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from service.config.settings import Settings
from service.telemetry.aggregates import HASH_KEY, Aggregates, Delta
from service.telemetry.exporter import MetricsPage, PipelineGauges, PipelineState
from service.telemetry.exposition import (
    CONTENT_TYPE,
    HistogramLayout,
    format_value,
    header,
    write_samples,
)
from service.telemetry.metrics import (
    EVENTS_PENDING,
    FAMILIES,
    OLDEST_PENDING_AGE,
    QUEUE_DEPTH,
    Family,
)
from tests.support.live import LiveServer
from tests.support.tools import require_tool

# Label values a scrape must carry through intact: the three escaped characters, a trailing
# backslash, unicode, the empty string.
AWKWARD = ("plain", 'say "hi"', "back\\slash", "two\nlines", "end\\", "naïve ✓ 日本語", "")

STATE = PipelineState(
    queue_depth={"judge": 3, "judge.urgent": 0},
    pending_events={"acme": 7, "default": 0},
    oldest_pending_age_seconds={"acme": 12.25, "default": 0.0},
)


class _Families(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def extra_families() -> list[Metric]:
    gauge = GaugeMetricFamily(
        "retrieval_monitor_judge_gold_kappa", "Kappa \\ against gold.", labels=["judge"]
    )
    gauge.add_metric(['j "1"'], 0.625)
    return [gauge]


def reference_page(
    values: dict[tuple[str, tuple[str, ...], str], float],
    state: PipelineState,
    extra: list[Metric],
) -> bytes:
    """The page built from prometheus_client's objects and formatted by ``generate_latest``."""
    by_family: dict[str, dict[tuple[str, ...], dict[str, float]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for (name, labels, part), value in values.items():
        by_family[name][labels][part] = value
    families: list[Metric] = []
    for name, family in FAMILIES.items():
        series = sorted(by_family.get(name, {}).items())
        if family.kind == "counter":
            counter = CounterMetricFamily(family.full_name, family.help, labels=family.labels)
            for labels, parts in series:
                counter.add_metric(list(labels), parts.get("", 0.0))
            families.append(counter)
        elif family.kind == "histogram":
            families.append(reference_histogram(family, series))
    depth = GaugeMetricFamily(QUEUE_DEPTH.full_name, QUEUE_DEPTH.help, labels=["queue"])
    for queue, count in state.queue_depth.items():
        depth.add_metric([queue], count)
    families.append(depth)
    pending = GaugeMetricFamily(EVENTS_PENDING.full_name, EVENTS_PENDING.help, labels=["tenant"])
    for tenant, count in state.pending_events.items():
        pending.add_metric([tenant], count)
    families.append(pending)
    age = GaugeMetricFamily(
        OLDEST_PENDING_AGE.full_name, OLDEST_PENDING_AGE.help, labels=["tenant"]
    )
    for tenant, seconds in state.oldest_pending_age_seconds.items():
        age.add_metric([tenant], seconds)
    families.append(age)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families([*families, *extra]))
    return generate_latest(registry)


def reference_histogram(
    family: Family, series: list[tuple[tuple[str, ...], dict[str, float]]]
) -> Metric:
    # A bare Metric, as HistogramMetricFamily drops _sum and _count with negative bounds.
    metric = Metric(family.full_name, family.help, "histogram")
    for labels, parts in series:
        base = dict(zip(family.labels, labels, strict=True))
        cumulative = 0.0
        for index, bound in enumerate(family.buckets):
            cumulative += parts.get(f"b{index}", 0.0)
            metric.add_sample(
                f"{family.full_name}_bucket", {**base, "le": repr(float(bound))}, cumulative
            )
        count = parts.get("count", 0.0)
        metric.add_sample(f"{family.full_name}_bucket", {**base, "le": "+Inf"}, count)
        metric.add_sample(f"{family.full_name}_count", base, count)
        metric.add_sample(f"{family.full_name}_sum", base, parts.get("sum", 0.0))
    return metric


def every_family_delta(round_: int) -> Delta:
    """Samples in every shared family, with awkward label values and values below, on and above
    the bounds (negative ones for T), and counters large enough for Go's exponent format."""
    delta = Delta()
    for index, (name, family) in enumerate(FAMILIES.items()):
        for offset in range(2):
            value = AWKWARD[(index + offset + round_) % len(AWKWARD)]
            labels = {label: f"{label}-{value}" for label in family.labels}
            labels[family.labels[0]] = value
            if family.kind == "counter":
                delta.inc(name, labels, 1_234_567.0 if offset else 2.5 + round_)
                continue
            low, high = family.buckets[0], family.buckets[-1]
            for observed in (low - 1.5, low, (low + high) / 3, high, high * 2 + 1, -0.3):
                delta.observe(name, labels, observed)
    return delta


def parsed(page: bytes) -> list[Metric]:
    return list(text_string_to_metric_families(page.decode()))


def type_lines(page: bytes) -> list[str]:
    return [line.split()[2] for line in page.decode().splitlines() if line.startswith("# TYPE ")]


def test_the_page_is_what_prometheus_client_renders_for_the_same_aggregates(
    redis_url: str,
) -> None:
    aggregates = Aggregates(redis.Redis.from_url(redis_url))
    page = MetricsPage(aggregates, [PipelineGauges(lambda: STATE), _Families(extra_families())])
    # Twice, so the second scrape reads new series and grown values through the parse cache.
    for round_ in range(2):
        aggregates.force_add(every_family_delta(round_))
        ours = page.render()
        reference = reference_page(aggregates.read(), STATE, extra_families())
        assert parsed(ours) == parsed(reference)
        assert ours == reference
    families = {family.name: family for family in parsed(ours)}
    assert {f.full_name for f in FAMILIES.values()} <= families.keys()
    assert len(type_lines(ours)) == len(set(type_lines(ours)))
    # The awkward values come back as they went in, and T keeps its negative buckets with
    # _sum and _count.
    label_values = {v for f in families.values() for s in f.samples for v in s.labels.values()}
    assert set(AWKWARD) <= label_values
    t_samples = families["retrieval_monitor_measure_t"].samples
    assert {s.labels.get("le") for s in t_samples} >= {"-2.0", "-0.25", "+Inf"}
    assert {s.name for s in t_samples} == {
        "retrieval_monitor_measure_t_bucket",
        "retrieval_monitor_measure_t_count",
        "retrieval_monitor_measure_t_sum",
    }
    assert b"1.234567e+06" in ours


def test_fields_the_page_cannot_place_are_left_out(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    aggregates = Aggregates(client)
    aggregates.force_add(every_family_delta(0))
    page = MetricsPage(aggregates, [PipelineGauges(lambda: STATE)])
    clean = page.render()
    client.hset(
        HASH_KEY,
        mapping={
            '["measure_retired",["a","b","c","d","e"],"sum"]': 1,  # another version's family
            '["measure_t",["too","few"],"b0"]': 1,
            '["events_rejected",["invalid"],"b3"]': 1,  # a part a counter does not have
            '["measure_t",["a","b","c","d","e"],"b99"]': 1,
            "not json": 1,
        },
    )
    assert page.render() == clean
    assert MetricsPage(aggregates, [PipelineGauges(lambda: STATE)]).render() == clean


def test_a_cleared_hash_leaves_no_series_behind(redis_url: str) -> None:
    aggregates = Aggregates(redis.Redis.from_url(redis_url))
    page = MetricsPage(aggregates, [PipelineGauges(lambda: STATE)])
    aggregates.force_add(every_family_delta(0))
    page.render()
    aggregates.clear()
    delta = Delta()
    delta.inc("events_rejected", {"reason": "invalid"})
    aggregates.force_add(delta)
    assert page.render() == reference_page(aggregates.read(), STATE, [])


# prometheus_client's own float formatting (untyped there).
go_float: Callable[[float], str] = floatToGoString
finite = st.floats(allow_nan=False, allow_infinity=False)
label_text = st.text(st.characters(blacklist_categories=["Cs"]), max_size=12)


@given(st.one_of(st.floats(), st.integers(-(10**20), 10**20).map(float)))
def test_values_are_formatted_as_prometheus_client_formats_them(value: float) -> None:
    assert format_value(value) == go_float(value)


@given(
    bounds=st.lists(finite, min_size=1, max_size=6, unique=True).map(sorted),
    series=st.lists(
        st.tuples(
            st.tuples(label_text, label_text),
            st.lists(st.floats(0, 1e9), min_size=6, max_size=6),
            st.floats(0, 1e9),
            finite,
        ),
        max_size=3,
        unique_by=lambda s: s[0],
    ),
    help_text=label_text,
)
def test_any_histogram_is_written_as_prometheus_client_writes_it(
    bounds: list[float],
    series: list[tuple[tuple[str, str], list[float], float, float]],
    help_text: str,
) -> None:
    family = Family("h", "histogram", help_text, ("zone", "app"), tuple(bounds))
    layout = HistogramLayout.of(family.full_name, family.labels, family.buckets)
    out = [header(family.full_name, help_text, "histogram")]
    formatted: dict[float, str] = {}
    for labels, buckets, count, total in series:
        layout.write(out, labels, buckets[: len(bounds)], count, total, formatted)
    reference = reference_histogram(
        family,
        [
            (labels, {**{f"b{i}": b for i, b in enumerate(buckets)}, "count": count, "sum": total})
            for labels, buckets, count, total in series
        ],
    )
    assert "".join(out).encode() == generate_latest(_Families([reference]))


@given(
    series=st.lists(st.tuples(label_text, finite), max_size=4, unique_by=lambda s: s[0]),
    help_text=label_text,
)
def test_any_counter_is_written_as_prometheus_client_writes_it(
    series: list[tuple[str, float]], help_text: str
) -> None:
    name = "retrieval_monitor_c"
    out = [header(f"{name}_total", help_text, "counter")]
    write_samples(out, f"{name}_total", ("reason",), (((label,), v) for label, v in series))
    counter = CounterMetricFamily(name, help_text, labels=["reason"])
    for label, value in series:
        counter.add_metric([label], value)
    assert "".join(out).encode() == generate_latest(_Families([counter]))


def test_promtool_accepts_a_scrape_of_the_served_app(settings: Settings, redis_url: str) -> None:
    promtool = require_tool("promtool")
    with LiveServer(settings) as server:
        aggregates = Aggregates(redis.Redis.from_url(redis_url))
        aggregates.force_add(every_family_delta(0))
        answer = httpx.get(f"{server.url}/metrics", timeout=30)
    assert answer.status_code == 200
    assert answer.headers["content-type"] == CONTENT_TYPE
    names = type_lines(answer.content)
    assert len(names) == len(set(names)), "a family appears twice"
    assert FAMILIES["measure_t"].full_name in names
    assert 'le="-2.0"' in answer.text
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=answer.content,
        capture_output=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert not result.stdout.strip(), result.stdout.decode()
