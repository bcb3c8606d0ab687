"""PNG figures of an analysis, for what reads better as a picture than as a table.

matplotlib is optional: without it the functions write nothing and say why. Figures are built
on ``matplotlib.figure.Figure`` directly, not pyplot, so no global state or GUI backend is
involved and the API can draw from worker threads.
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from service.analysis.correlation import REGIMES, CorrelationReport
from service.analysis.gold import GoldReport
from service.analysis.stats import Estimate
from service.measures.catalogue import ALPHA_MEASURES, CORRELATED

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from service.analysis.calibration import JudgeCalibration
    from service.analysis.compare import ComparisonReport
    from service.analysis.report import AnalysisReport

MISSING_MESSAGE = "plots skipped: matplotlib is not installed (pip install matplotlib)"
COLOURS = {"narrow": "#d95f02", "wide": "#1b9e77", "all": "#7570b3"}


@dataclass
class PlotOutcome:
    paths: list[Path] = field(default_factory=list)
    message: str | None = None


def matplotlib_available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _save(figure: Figure, directory: Path, name: str, outcome: PlotOutcome) -> None:
    path = directory / name
    figure.savefig(path, dpi=110)
    outcome.paths.append(path)


def _errors(estimates: list[Estimate]) -> list[list[float]]:
    below = [e.value - e.low if e.n and not math.isnan(e.low) else 0.0 for e in estimates]
    above = [e.high - e.value if e.n and not math.isnan(e.high) else 0.0 for e in estimates]
    return [below, above]


def _correlation_bars(correlation: CorrelationReport, axes: Axes) -> None:
    width = 0.8 / len(REGIMES)
    for offset, regime in enumerate(REGIMES):
        rows = [correlation.row(m, regime) for m in CORRELATED]
        xs = [i + (offset - 1) * width for i in range(len(CORRELATED))]
        values = [0.0 if math.isnan(r.spearman) else r.spearman for r in rows]
        below = [0.0 if math.isnan(r.spearman_low) else r.spearman - r.spearman_low for r in rows]
        above = [0.0 if math.isnan(r.spearman_high) else r.spearman_high - r.spearman for r in rows]
        axes.bar(
            xs,
            values,
            width,
            yerr=[below, above],
            capsize=2,
            color=COLOURS[regime],
            label=f"{regime} (n={max(r.n for r in rows)})",
        )
        for x, row in zip(xs, rows, strict=True):
            if math.isnan(row.spearman):
                # A missing bar must not read as a correlation of 0.
                axes.text(x, 0.01, "n/a", ha="center", va="bottom", fontsize="x-small")
    axes.set_xticks(range(len(CORRELATED)), list(CORRELATED))
    axes.axhline(0.0, color="black", linewidth=0.6)
    axes.set_ylabel("Spearman with response grade")
    axes.set_title("Which measure tracks answer quality (95% intervals)")
    axes.legend()


def _alpha_curves(correlation: CorrelationReport, figure: Figure) -> None:
    regimes = [r for r in REGIMES if correlation.row("t", r).n]
    panels = figure.subplots(1, max(1, len(regimes)), squeeze=False)[0]
    for axes, regime in zip(panels, regimes, strict=False):
        for measure in ALPHA_MEASURES:
            row = correlation.row(measure, regime)
            if not row.spearman_by_alpha or row.n == 0:
                continue
            line = axes.plot(correlation.alpha_grid, row.spearman_by_alpha, label=measure)
            if row.alpha is not None:
                axes.axvline(row.alpha, color=line[0].get_color(), linestyle=":", linewidth=1)
        axes.set_title(f"{regime} (n={correlation.row('t', regime).n})")
        axes.set_xlabel("alpha")
        axes.set_ylabel("Spearman")
        axes.legend()
    figure.suptitle("Spearman with the response grade as alpha varies (dotted: best alpha)")


def _regime_bars(correlation: CorrelationReport, axes: Axes) -> None:
    bins = correlation.regimes.bins
    colours = [
        COLOURS["narrow"] if b.label.startswith(("[0,", "[0.5,")) else COLOURS["wide"] for b in bins
    ]
    axes.bar(range(len(bins)), [b.count for b in bins], color=colours)
    axes.set_xticks(range(len(bins)), [b.label for b in bins], rotation=30, ha="right")
    axes.set_ylabel("events")
    dist = correlation.regimes
    axes.set_title(
        f"K/N_p per event (narrow {dist.narrow}, wide {dist.wide}; {dist.from_gold} with gold N_p)"
    )


def _gold_figure(gold: GoldReport, figure: Figure) -> None:
    curve_axes, bar_axes = figure.subplots(1, 2)
    cutoffs = [p.cutoff for p in gold.curve]
    hits = [p.hit for p in gold.curve]
    curve_axes.plot(cutoffs, [h.value for h in hits], marker="o", label="hit@c (any gold)")
    curve_axes.fill_between(
        cutoffs, [h.low for h in hits], [h.high for h in hits], alpha=0.2, label="95% (Wilson)"
    )
    curve_axes.plot(
        cutoffs, [p.recall.value for p in gold.curve], marker=".", linestyle="--", label="recall@c"
    )
    curve_axes.errorbar(
        [gold.median_k],
        [gold.ceiling.value],
        yerr=_errors([gold.ceiling]),
        fmt="s",
        color="black",
        capsize=3,
        label=f"ceiling at prompt k={gold.median_k:g}",
    )
    if gold.first_stage is not None:
        staged = gold.first_stage
        curve_axes.errorbar(
            [staged.median_depth],
            [staged.first_stage_hit.value],
            yerr=_errors([staged.first_stage_hit]),
            fmt="D",
            color="grey",
            capsize=3,
            label="first stage",
        )
    if cutoffs and max(cutoffs) / max(min(cutoffs), 1) > 10:
        curve_axes.set_xscale("log")
    curve_axes.set_ylim(0.0, 1.02)
    curve_axes.set_xlabel("cutoff c")
    curve_axes.set_title(f"Recall curve, {gold.events} gold questions")
    curve_axes.legend(loc="lower right", fontsize="small")

    names = ["ceiling", "conversion", "predicted", "observed"]
    values = [gold.ceiling, gold.conversion, gold.predicted_accuracy, gold.observed_accuracy]
    bar_axes.bar(
        names,
        [0.0 if math.isnan(v.value) else v.value for v in values],
        yerr=_errors(values),
        capsize=4,
        color=["#4c72b0", "#55a868", "#c44e52", "#8172b2"],
    )
    bar_axes.set_ylim(0.0, 1.05)
    bar_axes.set_title(
        f"MRR@k {gold.mrr.value:.3f}; accuracy = ceiling x conversion?"
        if gold.mrr.n
        else "accuracy = ceiling x conversion?"
    )


def _calibration_triples(calibration: JudgeCalibration) -> dict[str, tuple[float, float, float]]:
    precision, recall, kappa = calibration.precision, calibration.recall, calibration.kappa
    return {
        "precision": (precision.value, precision.low, precision.high),
        "recall": (recall.value, recall.low, recall.high),
        "kappa": (kappa.kappa, kappa.low, kappa.high),
    }


def _calibration_figure(calibrations: list[JudgeCalibration], axes: Axes) -> None:
    names = [f"{c.judge}@{c.prompt_version}" for c in calibrations]
    table = [_calibration_triples(c) for c in calibrations]
    for offset, label in enumerate(("precision", "recall", "kappa")):
        triples = [row[label] for row in table]
        ys = [i + (offset - 1) * 0.25 for i in range(len(calibrations))]
        axes.errorbar(
            [t[0] for t in triples],
            ys,
            xerr=[[t[0] - t[1] for t in triples], [t[2] - t[0] for t in triples]],
            fmt="o",
            capsize=3,
            label=label,
        )
    axes.set_yticks(range(len(names)), names)
    axes.set_xlim(-0.05, 1.05)
    axes.set_title("Judge against gold labels (95% intervals)")
    axes.legend()


def write_plots(report: AnalysisReport, directory: Path) -> PlotOutcome:
    """Write the report's figures into ``directory`` (created if needed)."""
    outcome = PlotOutcome()
    if not matplotlib_available():
        outcome.message = MISSING_MESSAGE
        return outcome
    directory.mkdir(parents=True, exist_ok=True)
    correlation = report.correlation
    if correlation is not None and correlation.graded_events:
        figure = _figure(10, 4.5)
        _correlation_bars(correlation, figure.subplots())
        _save(figure, directory, "correlation.png", outcome)
        figure = _figure(11, 4)
        _alpha_curves(correlation, figure)
        _save(figure, directory, "alpha.png", outcome)
    if correlation is not None and correlation.judged_events:
        figure = _figure(8, 4)
        _regime_bars(correlation, figure.subplots())
        _save(figure, directory, "regime.png", outcome)
    if report.gold is not None and report.gold.events:
        figure = _figure(12, 4.5)
        _gold_figure(report.gold, figure)
        _save(figure, directory, "gold.png", outcome)
    if report.calibration:
        figure = _figure(8, 1.5 + 0.8 * len(report.calibration))
        _calibration_figure(report.calibration, figure.subplots())
        _save(figure, directory, "calibration.png", outcome)
    if not outcome.paths:
        outcome.message = "no plots: the window holds nothing to draw"
    return outcome


def write_comparison_plots(report: ComparisonReport, directory: Path) -> PlotOutcome:
    """One figure: B - A for every compared quantity, with its interval."""
    outcome = PlotOutcome()
    if not matplotlib_available():
        outcome.message = MISSING_MESSAGE
        return outcome
    items = list(report.quantities)
    if report.paired_ceiling is not None:
        items.append(report.paired_ceiling)
    items = [q for q in items if not math.isnan(q.test.difference)]
    if not items:
        outcome.message = "no plots: nothing to compare"
        return outcome
    directory.mkdir(parents=True, exist_ok=True)
    figure = _figure(9, 1.5 + 0.45 * len(items))
    axes = figure.subplots()
    for index, item in enumerate(items):
        test = item.test
        axes.errorbar(
            [test.difference],
            [index],
            xerr=[[test.difference - test.low], [test.high - test.difference]],
            fmt="o",
            capsize=3,
            color="#c44e52" if test.real else "#4c72b0",
        )
    axes.axvline(0.0, color="black", linewidth=0.6)
    axes.set_yticks(range(len(items)), [q.name for q in items])
    axes.invert_yaxis()
    axes.set_xlabel("B - A (95% interval; red: real at this sample size)")
    axes.set_title(f"A: {report.a.label}   B: {report.b.label}")
    _save(figure, directory, "compare.png", outcome)
    return outcome
