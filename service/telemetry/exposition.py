"""The Prometheus text exposition format (version 0.0.4), written directly.

A scrape carries tens of thousands of samples, most of them histogram buckets. Building one
prometheus_client ``Metric`` sample per bucket and letting ``generate_latest`` escape every label of
every sample cost most of a scrape; here a series' labels are escaped and joined once, and its
bucket lines only splice in the ``le`` value. The text is the same, byte for byte, as
``generate_latest`` writes for the same families
(``tests/integration/telemetry/test_exposition.py`` holds it
to that): labels sorted by name, label values escaped (backslash, double quote, newline), HELP
escaped (backslash, newline), values formatted the way Go formats floats.

Only legal metric and label names are written (no UTF-8 quoting), so the text is valid under
both the 0.0.4 and the 1.0.0 text format; it is served as 0.0.4, which every Prometheus reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    """A sample value as Go writes it, e.g. ``4.0``, ``1.5e+06``, ``+Inf``, ``NaN``."""
    if value < 1e6 and value > -math.inf:  # the common case, and false for NaN
        return repr(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    text = repr(value)
    if "e" in text:  # Python already uses an exponent from 1e16 on
        return text
    # Go switches to an exponent from 1e6 on: 1234567.0 is 1.234567e+06.
    whole, _, fraction = text.partition(".")
    mantissa = f"{whole[0]}.{whole[1:]}{fraction}".rstrip("0").rstrip(".")
    return f"{mantissa}e+{len(whole) - 1:02d}"


def format_bound(bound: float) -> str:
    """A bucket's ``le`` label value (Python's repr: ``0.1``, ``-2.0``, ``3600.0``)."""
    return repr(float(bound))


def header(name: str, help_text: str, kind: str) -> str:
    return f"# HELP {name} {escape_help(help_text)}\n# TYPE {name} {kind}\n"


def _joined(pairs: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{name}="{escape_label_value(value)}"' for name, value in pairs)


@dataclass(frozen=True)
class SeriesLabels:
    """One series' label pairs, escaped and sorted by name, joined once for all its lines."""

    all: str  # every pair
    before_le: str  # the pairs sorting before a histogram's "le", then those after it
    after_le: str


# A scrape writes the same series as the previous one; joining their labels again would be most
# of its work. Room for 16,384 label sets (about 13 MiB when full, ~800 bytes for five labels;
# the benchmark's page has 1,500 series); past that a miss only costs the join.
@lru_cache(maxsize=1 << 14)
def series_labels(names: tuple[str, ...], values: tuple[str, ...]) -> SeriesLabels:
    pairs = sorted(zip(names, values, strict=True))
    return SeriesLabels(
        _joined(pairs),
        _joined(p for p in pairs if p[0] < "le"),
        _joined(p for p in pairs if p[0] > "le"),
    )


def label_set(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """``{a="x",b="y"}`` sorted by label name, or ``""`` without labels."""
    if not names:
        return ""
    return "{" + series_labels(names, values).all + "}"


def write_samples(
    out: list[str],
    sample_name: str,
    label_names: tuple[str, ...],
    series: Iterable[tuple[tuple[str, ...], float]],
) -> None:
    """One line per series: a counter's ``_total`` or a gauge."""
    for values, value in series:
        out.append(f"{sample_name}{label_set(label_names, values)} {format_value(float(value))}\n")


@dataclass(frozen=True)
class HistogramLayout:
    """What every series of one histogram family shares, computed once per family."""

    name: str
    label_names: tuple[str, ...]
    # The escaped ``le="..."`` pair of every finite bound.
    le_pairs: tuple[str, ...]

    @classmethod
    def of(cls, name: str, label_names: Sequence[str], bounds: Sequence[float]) -> HistogramLayout:
        return cls(
            name,
            tuple(label_names),
            tuple(f'le="{escape_label_value(format_bound(bound))}"' for bound in bounds),
        )

    def write(
        self,
        out: list[str],
        label_values: tuple[str, ...],
        buckets: Sequence[float],
        count: float,
        total: float,
        formatted: dict[float, str],
    ) -> None:
        """The series' bucket lines, _count and _sum; ``buckets`` holds one count per finite bound,
        not cumulative, and what lies above the last bound is only in ``count``. ``formatted``
        caches bucket values' text over a scrape (counts repeat: most buckets hold a few)."""
        labels = series_labels(self.label_names, label_values)
        name = self.name
        prefix = f"{name}_bucket{{{labels.before_le}," if labels.before_le else f"{name}_bucket{{"
        suffix = f",{labels.after_le}}} " if labels.after_le else "} "
        cumulative = 0.0  # and 0.0 + -0.0 is 0.0: no -0.0 to tell from 0.0 in ``formatted``
        for le, in_bucket in zip(self.le_pairs, buckets, strict=True):
            cumulative += in_bucket
            text = formatted.get(cumulative)
            if text is None:
                text = formatted[cumulative] = format_value(cumulative)
            out.append(f"{prefix}{le}{suffix}{text}\n")
        plain = f"{{{labels.all}}}" if self.label_names else ""
        count_text = format_value(float(count))
        out.append(f'{prefix}le="+Inf"{suffix}{count_text}\n')
        out.append(f"{name}_count{plain} {count_text}\n")
        out.append(f"{name}_sum{plain} {format_value(float(total))}\n")
