"""What the monitoring tests share: the series the service exports, and the rules' and the
dashboards' queries with their template variables filled in."""

from __future__ import annotations

from service.analysis.gauges import GAUGES as GOLD_GAUGES
from service.telemetry.metrics import (
    BUDGET_REMAINING,
    EVENTS_PENDING,
    FAMILIES,
    OLDEST_PENDING_AGE,
    QUEUE_DEPTH,
)

# Families the rules read that the service does not export yet: an HTTP status counter. Listed
# so that a typo elsewhere cannot pass as "pending".
PENDING_METRICS: frozenset[str] = frozenset()


def exported_series() -> set[str]:
    """Every series name the service exports, from its metric contract."""
    names = {
        f.full_name for f in (QUEUE_DEPTH, OLDEST_PENDING_AGE, EVENTS_PENDING, BUDGET_REMAINING)
    }
    names.update(gauge.full_name for gauge in GOLD_GAUGES)
    for family in FAMILIES.values():
        if family.kind == "counter":
            names.add(f"{family.full_name}_total")
        elif family.kind == "histogram":
            names.update(f"{family.full_name}_{part}" for part in ("bucket", "sum", "count"))
    return names


# What a variable or Grafana macro stands for when the queries are checked or evaluated.
TEST_VALUES = {
    "$__rate_interval": "1m",
    "$tenant": ".*",
    "$environment": ".*",
    "$app": ".*",
    "$retriever": ".*",
    "$judge": ".*",
}


def substitute(expr: str, values: dict[str, str]) -> str:
    # Longest names first: $__rate_interval before any shorter name it starts with.
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(name, values[name])
    return expr
