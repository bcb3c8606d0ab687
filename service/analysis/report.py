"""One analysis as a JSON-able dataclass, and its rendering as a terminal table.

JSON carries no NaN or infinity: both become null, the same "cannot be computed" the measures
use. Plots live in ``service.analysis.plots``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np

from service.analysis.calibration import JudgeCalibration
from service.analysis.compare import ComparedQuantity, ComparisonReport
from service.analysis.correlation import (
    REGIMES,
    CorrelationReport,
    MeasureCorrelation,
    RegimeDistribution,
)
from service.analysis.gold import GoldReport
from service.analysis.stats import DifferenceTest, Estimate
from service.measures.catalogue import CORRELATED
from service.store.analysis import JudgeCount


@dataclass(frozen=True)
class Scope:
    since: datetime
    until: datetime
    app: str | None
    retriever: str | None
    judge: str | None
    prompt_version: str | None
    relevance_threshold: int
    alpha: float


@dataclass(frozen=True)
class Counts:
    events: int
    judged: int
    graded: int
    gold: int
    gold_with_feedback: int
    truncated: bool
    judges: list[JudgeCount]


@dataclass(frozen=True)
class AnalysisReport:
    scope: Scope
    counts: Counts
    correlation: CorrelationReport | None
    gold: GoldReport | None
    calibration: list[JudgeCalibration]
    notes: list[str] = field(default_factory=list)


# Read-only properties worth having in the JSON beside the fields.
_PROPERTIES: dict[type, tuple[str, ...]] = {
    DifferenceTest: ("real", "verdict"),
    RegimeDistribution: ("dominant",),
    MeasureCorrelation: ("enough",),
}


def to_jsonable(value: Any) -> Any:
    """Dataclasses to dicts, NaN and infinities to None, datetimes to ISO 8601, numpy scalars
    to Python ones."""
    if isinstance(value, np.generic):
        value = value.item()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
        for name in _PROPERTIES.get(type(value), ()):
            out[name] = to_jsonable(getattr(value, name))
        return out
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return value


# ---------------------------------------------------------------------------------------------
# Terminal rendering


def fmt(value: float | None, digits: int = 3) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.{digits}f}"


def fmt_estimate(estimate: Estimate, digits: int = 3) -> str:
    if estimate.n == 0 or math.isnan(estimate.value):
        return "-"
    return (
        f"{estimate.value:.{digits}f} [{fmt(estimate.low, digits)}, {fmt(estimate.high, digits)}]"
    )


def _table(header: list[str], rows: Iterable[list[str]], right: set[int] | None = None) -> str:
    body = [header, *rows]
    widths = [max(len(r[i]) for r in body) for i in range(len(header))]
    aligned = right if right is not None else set(range(1, len(header)))
    lines = []
    for index, row in enumerate(body):
        cells = [
            cell.rjust(widths[i]) if i in aligned else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ]
        lines.append("  " + "  ".join(cells).rstrip())
        if index == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _when(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M")


def _header(report: AnalysisReport) -> list[str]:
    scope, counts = report.scope, report.counts
    judge = f"{scope.judge} (prompt {scope.prompt_version})" if scope.judge else "none"
    lines = [
        f"retrieval-monitor analysis  {_when(scope.since)} .. {_when(scope.until)} UTC  "
        f"app={scope.app or 'all'}  retriever={scope.retriever or 'all'}",
        f"judge: {judge}   relevant: grade >= {scope.relevance_threshold}   "
        f"default alpha {scope.alpha:g}",
        f"events {counts.events}  judged {counts.judged}  with response grade {counts.graded}  "
        f"gold {counts.gold} ({counts.gold_with_feedback} with answer_correct)"
        + ("  [window truncated to the most recent events]" if counts.truncated else ""),
    ]
    others = [
        j
        for j in counts.judges
        if (j.judge, j.prompt_version) != (scope.judge, scope.prompt_version)
    ]
    if others:
        lines.append(
            "other judges in the window: "
            + ", ".join(f"{j.judge}@{j.prompt_version} ({j.events})" for j in others)
        )
    return lines


def _correlation_section(correlation: CorrelationReport) -> list[str]:
    lines = [
        "",
        "Which measure tracks answer quality (correlation with the response grade, 1-5)",
    ]
    rows: list[list[str]] = []
    for regime in REGIMES:
        for measure in CORRELATED:
            row = correlation.row(measure, regime)
            if row.n == 0:
                continue
            plateau = ""
            if row.alpha_plateau == (0.0, 1.0):
                plateau = "any"  # alpha changes no ranking: every event has the same K
            elif row.alpha_plateau is not None:
                low, high = row.alpha_plateau
                plateau = f"{low:g}" if low == high else f"{low:g}-{high:g}"
            rows.append(
                [
                    {"narrow": "narrow K<N_p", "wide": "wide K>=N_p", "all": "all"}[regime],
                    measure,
                    str(row.n),
                    "-"
                    if math.isnan(row.spearman)
                    else f"{fmt(row.spearman, 2)} [{fmt(row.spearman_low, 2)}, "
                    f"{fmt(row.spearman_high, 2)}]",
                    fmt(row.pearson, 2),
                    fmt(row.kendall, 2),
                    "" if row.alpha is None else f"{row.alpha:g}",
                    plateau,
                ]
            )
    if rows:
        lines.append(
            _table(
                [
                    "regime",
                    "measure",
                    "n",
                    "spearman [95%]",
                    "pearson",
                    "kendall",
                    "alpha*",
                    "near-best",
                ],
                rows,
                right={2, 4, 5, 6},
            )
        )
    else:
        lines.append("  no event carries a response grade yet (send it as feedback)")
    dist = correlation.regimes
    lines.append("")
    lines.append(
        f"K/N_p (N_p from gold for {dist.from_gold} events, else estimated from the top 2K): "
        f"narrow {dist.narrow}, wide {dist.wide}, unknown {dist.unknown}; "
        f"median {fmt(dist.median_ratio, 2)}"
    )
    total = max(1, sum(b.count for b in dist.bins))
    lines.append(
        "  " + "  ".join(f"{b.label}: {100.0 * b.count / total:.0f}%" for b in dist.bins if b.count)
    )
    rec = correlation.recommendation
    lines.append(f"Lead with: {rec.measure}  ({rec.basis}) {rec.text}")
    return lines


def _gold_section(gold: GoldReport) -> list[str]:
    lines = ["", f"Gold traffic: {gold.events} questions, prompt k (median) {gold.median_k:g}"]
    rows = [
        [f"@{p.cutoff}", str(p.hit.n), fmt_estimate(p.hit), fmt(p.hit.se), fmt_estimate(p.recall)]
        for p in gold.curve
    ]
    if rows:
        lines.append(
            _table(["cutoff", "n", "hit (any gold) [95%]", "se", "recall [95%]"], rows, {1, 3})
        )
    summary = [
        ["MRR@k", fmt_estimate(gold.mrr), fmt(gold.mrr.se), str(gold.mrr.n)],
        ["ceiling (hit@k)", fmt_estimate(gold.ceiling), fmt(gold.ceiling.se), str(gold.ceiling.n)],
        [
            "recall@k",
            fmt_estimate(gold.ceiling_recall),
            fmt(gold.ceiling_recall.se),
            str(gold.ceiling_recall.n),
        ],
        [
            "conversion",
            fmt_estimate(gold.conversion),
            fmt(gold.conversion.se),
            str(gold.conversion.n),
        ],
        [
            "predicted accuracy",
            fmt_estimate(gold.predicted_accuracy),
            fmt(gold.predicted_accuracy.se),
            str(gold.predicted_accuracy.n),
        ],
        [
            "observed accuracy",
            fmt_estimate(gold.observed_accuracy),
            fmt(gold.observed_accuracy.se),
            str(gold.observed_accuracy.n),
        ],
    ]
    staged = gold.first_stage
    if staged is not None:
        summary += [
            [
                f"first stage hit (depth {staged.median_depth:g})",
                fmt_estimate(staged.first_stage_hit),
                fmt(staged.first_stage_hit.se),
                str(staged.events),
            ],
            [
                "after rerank hit@k",
                fmt_estimate(staged.prompt_hit),
                fmt(staged.prompt_hit.se),
                str(staged.events),
            ],
        ]
    lines.append("")
    lines.append(_table(["", "value [95%]", "se", "n"], summary, {2, 3}))
    if gold.with_feedback:
        lines.append(
            f"  misses: retrieval {gold.retrieval_misses}, generation {gold.generation_misses}, "
            f"right without gold {gold.correct_without_gold}"
        )
    lines.extend(f"  - {note}" for note in gold.diagnosis)
    return lines


def _calibration_section(calibrations: list[JudgeCalibration]) -> list[str]:
    rows = [
        [
            c.judge,
            c.prompt_version,
            str(c.events),
            str(c.passages),
            fmt_estimate(c.precision, 2),
            fmt_estimate(c.recall, 2),
            f"{fmt(c.kappa.kappa, 2)} [{fmt(c.kappa.low, 2)}, {fmt(c.kappa.high, 2)}]",
        ]
        for c in calibrations
    ]
    return [
        "",
        "Judge against gold labels (the smoke alarm checked against the instrument)",
        _table(
            [
                "judge",
                "prompt",
                "events",
                "passages",
                "precision [95%]",
                "recall [95%]",
                "kappa [95%]",
            ],
            rows,
            {2, 3},
        ),
    ]


def render_table(report: AnalysisReport) -> str:
    lines = _header(report)
    if report.correlation is not None:
        lines += _correlation_section(report.correlation)
    if report.gold is not None:
        lines += _gold_section(report.gold)
    if report.calibration:
        lines += _calibration_section(report.calibration)
    if report.notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in report.notes)
    return "\n".join(lines) + "\n"


def _comparison_row(item: ComparedQuantity) -> list[str]:
    test = item.test
    return [
        item.name,
        fmt(test.a),
        fmt(test.b),
        f"{fmt(test.difference)} [{fmt(test.low)}, {fmt(test.high)}]",
        fmt(test.p_value),
        fmt(test.minimum_detectable),
        test.verdict if not test.real else "real",
    ]


def render_comparison(report: ComparisonReport) -> str:
    a, b = report.a, report.b
    lines = [
        f"A (baseline): {a.label}  judged {a.judged_events}, gold {a.gold_events}",
        f"B:            {b.label}  judged {b.judged_events}, gold {b.gold_events}",
        "",
    ]
    rows = [_comparison_row(q) for q in report.quantities]
    if report.paired_ceiling is not None:
        rows.append(_comparison_row(report.paired_ceiling))
    if rows:
        lines.append(
            _table(
                ["quantity", "A", "B", "B - A [95%]", "p", "detectable", "verdict"],
                rows,
                {1, 2, 4, 5},
            )
        )
    else:
        lines.append("  nothing to compare: one side has no events")
    if report.predicted_b.n:
        lines.append(
            f"\npredicted accuracy of B (B's ceiling x A's conversion): "
            f"{fmt_estimate(report.predicted_b)}; observed {fmt_estimate(report.observed_b)}"
        )
    lines.extend(f"  - {note}" for note in report.notes)
    return "\n".join(lines) + "\n"
