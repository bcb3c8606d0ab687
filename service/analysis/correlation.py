"""The paper's method on the user's own traffic: which retrieval measure tracks answer quality.

For each measure, Spearman, Pearson and Kendall tau-b correlation with the response grades (1-5)
sent as feedback, separately for narrow events (K < N_p) and wide ones (K >= N_p). N_p is the
number of gold passages when the event carries gold ids, else the estimate N^_p (relevant passages
among the top 2K the judge saw). Measures with a parameter (T, T_u, F_e, F) are recomputed from
the per-event labels for every alpha of a grid, and reported at the alpha that maximises
Spearman, as the paper does. That maximum is chosen on the same events it is reported on, so it
is optimistic; the plateau of near-best alphas says how sharply the data pins alpha down.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from service.analysis import stats
from service.analysis.stats import Estimate, FloatArray, IntArray
from service.measures.catalogue import ALPHA_MEASURES, BY_NAME, CORRELATED, NARROW_LEAD, WIDE_LEAD
from service.measures.formulas import compute_batch

ALPHA_GRID: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(21))
# What a dashboard can show on traffic without gold labels.
REFERENCE_FREE: tuple[str, ...] = tuple(m for m in CORRELATED if not BY_NAME[m].needs_gold)
REGIMES: tuple[str, ...] = ("narrow", "wide", "all")
PLATEAU_TOLERANCE = 0.01
TIE = 1e-9
MIN_EVENTS = 30
# Upper edges of the K/N_p histogram; narrow is below 1.
RATIO_EDGES: tuple[float, ...] = (0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


@dataclass(frozen=True)
class JudgedTraffic:
    """One row per judged event, in the layout of ``service.measures.formulas.compute_batch``.

    ``grades``: (n, width) judge grades 0-3 in rank order, NaN when missing or past the
    passages sent; ``n_sent``: passages judged per event (at most 2k); ``response_grades``:
    1-5 or NaN; ``gold_relevant``: (n, width) whether the passage is a gold one; ``n_gold``:
    number of gold passages, NaN for events without gold ids.
    """

    grades: FloatArray
    ks: IntArray
    n_sent: IntArray
    context_ratings: FloatArray
    response_grades: FloatArray
    gold_relevant: NDArray[np.bool_]
    n_gold: FloatArray
    threshold: int = 2

    def __post_init__(self) -> None:
        n = self.grades.shape[0]
        for name in ("ks", "n_sent", "context_ratings", "response_grades", "n_gold"):
            if getattr(self, name).shape != (n,):
                raise ValueError(f"{name} must have one value per event ({n})")
        if self.gold_relevant.shape != self.grades.shape:
            raise ValueError("gold_relevant must have the shape of grades")

    @property
    def size(self) -> int:
        return int(self.grades.shape[0])

    def measures(self, alpha: float) -> dict[str, FloatArray]:
        return compute_batch(
            self.grades,
            self.ks,
            alpha,
            n_sent=self.n_sent,
            threshold=self.threshold,
            context_ratings=self.context_ratings,
            gold_relevant=self.gold_relevant,
            n_gold=self.n_gold,
        )


def np_counts(traffic: JudgedTraffic) -> tuple[FloatArray, NDArray[np.bool_]]:
    """(N_p per event, whether it came from gold): the gold count when the event has gold ids,
    else N^_p, the relevant passages among the top min(2K, sent); NaN when a label in that
    window is missing."""
    width = traffic.grades.shape[1]
    position = np.arange(width)
    window = np.minimum(2 * traffic.ks, traffic.n_sent)
    in_window = position[None, :] < window[:, None]
    missing = np.isnan(traffic.grades) & in_window
    relevant = np.where(np.isnan(traffic.grades), False, traffic.grades >= traffic.threshold)
    estimate = (relevant & in_window).sum(axis=1).astype(np.float64)
    estimate = np.where(missing.any(axis=1), np.nan, estimate)
    from_gold = ~np.isnan(traffic.n_gold)
    return np.where(from_gold, traffic.n_gold, estimate), from_gold


def regime_masks(traffic: JudgedTraffic) -> dict[str, NDArray[np.bool_]]:
    """narrow: K < N_p; wide: K >= N_p (N_p = 0 is the widest); all: every event."""
    n_p, _ = np_counts(traffic)
    known = ~np.isnan(n_p)
    narrow = known & (traffic.ks < np.where(known, n_p, 0.0))
    return {"narrow": narrow, "wide": known & ~narrow, "all": np.ones(traffic.size, dtype=bool)}


# ---------------------------------------------------------------------------------------------
# The K/N_p distribution


@dataclass(frozen=True)
class RatioBin:
    label: str
    count: int


@dataclass(frozen=True)
class RegimeDistribution:
    """How the judged events spread over K/N_p (N_p from gold when known, else estimated)."""

    events: int
    narrow: int
    wide: int
    unknown: int
    from_gold: int
    no_relevant: int  # N_p = 0: K/N_p is infinite
    median_ratio: float
    bins: list[RatioBin]

    @property
    def dominant(self) -> str:
        return "narrow" if self.narrow > self.wide else "wide"


def regime_distribution(traffic: JudgedTraffic) -> RegimeDistribution:
    n_p, from_gold = np_counts(traffic)
    known = ~np.isnan(n_p)
    positive = known & (n_p > 0)
    ratios = traffic.ks[positive] / n_p[positive]
    no_relevant = int(np.count_nonzero(known & (n_p == 0)))
    bins: list[RatioBin] = []
    lower = 0.0
    for edge in RATIO_EDGES:
        count = int(np.count_nonzero((ratios >= lower) & (ratios < edge)))
        bins.append(RatioBin(f"[{lower:g}, {edge:g})", count))
        lower = edge
    bins.append(RatioBin(f">= {lower:g}", int(np.count_nonzero(ratios >= lower))))
    bins.append(RatioBin("no relevant (inf)", no_relevant))
    all_ratios = np.concatenate((ratios, np.full(no_relevant, np.inf)))
    masks = regime_masks(traffic)
    return RegimeDistribution(
        events=traffic.size,
        narrow=int(masks["narrow"].sum()),
        wide=int(masks["wide"].sum()),
        unknown=int(np.count_nonzero(~known)),
        from_gold=int(np.count_nonzero(from_gold)),
        no_relevant=no_relevant,
        median_ratio=float(np.median(all_ratios)) if all_ratios.size else stats.NAN,
        bins=bins,
    )


# ---------------------------------------------------------------------------------------------
# Correlations


@dataclass(frozen=True)
class MeasureCorrelation:
    """One measure against the response grade in one regime.

    ``alpha``: the alpha the three correlations are at (the Spearman maximiser) for T, T_u, F_e
    and F, None for the others. ``alpha_plateau``: the lowest and highest alphas of the grid
    whose Spearman is within 0.01 of the best. ``spearman_by_alpha``: Spearman at each alpha
    of the grid (None for measures without alpha).
    """

    measure: str
    regime: str
    n: int
    spearman: float
    spearman_low: float
    spearman_high: float
    pearson: float
    kendall: float
    alpha: float | None
    alpha_plateau: tuple[float, float] | None
    spearman_by_alpha: list[float] | None

    @property
    def enough(self) -> bool:
        return self.n >= MIN_EVENTS and not math.isnan(self.spearman)


@dataclass(frozen=True)
class Recommendation:
    """The measure to lead the dashboard with, for the regime most of the traffic is in.

    ``basis``: "data" when the graded events decided it, "paper" when there were too few and
    the paper's finding stands in (T at K/N_p around 1 or below, nDCG at high K/N_p).
    ``tied_with``: measures that rank the graded events exactly as the lead does (same
    Spearman). ``margin``: Spearman of the lead minus that of the runner-up (the best measure
    not tied), with a paired bootstrap interval; an interval containing 0 means the two cannot
    be told apart on this traffic.
    """

    regime: str
    measure: str
    alpha: float | None
    basis: str
    paper_expects: str
    tied_with: list[str]
    runner_up: str | None
    margin: Estimate | None
    text: str


@dataclass(frozen=True)
class CorrelationReport:
    judged_events: int
    graded_events: int
    alpha_grid: list[float]
    default_alpha: float
    rows: list[MeasureCorrelation]
    regimes: RegimeDistribution
    recommendation: Recommendation

    def row(self, measure: str, regime: str) -> MeasureCorrelation:
        for candidate in self.rows:
            if candidate.measure == measure and candidate.regime == regime:
                return candidate
        raise KeyError((measure, regime))


def _pick_alpha(spearmans: FloatArray, grid: FloatArray, default_alpha: float) -> int | None:
    if np.all(np.isnan(spearmans)):
        return None
    best = float(np.nanmax(spearmans))
    # Ties (alpha changes no ranking when every event has the same K) go to the configured
    # default, so the report does not suggest a change that changes nothing.
    tied = np.flatnonzero(spearmans >= best - 1e-12)
    return int(tied[np.argmin(np.abs(grid[tied] - default_alpha))])


def _correlate(
    name: str,
    regime: str,
    values: FloatArray,
    grades: FloatArray,
    alpha: float | None = None,
    plateau: tuple[float, float] | None = None,
    by_alpha: list[float] | None = None,
) -> MeasureCorrelation:
    valid = ~(np.isnan(values) | np.isnan(grades))
    x, y = values[valid], grades[valid]
    rho = stats.spearman(x, y)
    low, high = stats.correlation_interval(rho, int(x.size), "spearman")
    return MeasureCorrelation(
        measure=name,
        regime=regime,
        n=int(x.size),
        spearman=rho,
        spearman_low=low,
        spearman_high=high,
        pearson=stats.pearson(x, y),
        kendall=stats.kendall_tau_b(x, y),
        alpha=alpha,
        alpha_plateau=plateau,
        spearman_by_alpha=by_alpha,
    )


def correlate(
    traffic: JudgedTraffic,
    *,
    default_alpha: float = 0.5,
    alpha_grid: tuple[float, ...] = ALPHA_GRID,
    reps: int = 1000,
    seed: int = 0,
) -> CorrelationReport:
    """Every measure of ``CORRELATED`` in every regime, the best alphas and the lead measure."""
    grid = np.asarray(alpha_grid, dtype=np.float64)
    per_alpha = [traffic.measures(float(a)) for a in grid]
    fixed = traffic.measures(default_alpha)
    masks = regime_masks(traffic)
    grades = traffic.response_grades
    rows: list[MeasureCorrelation] = []
    chosen: dict[tuple[str, str], FloatArray] = {}
    for regime in REGIMES:
        mask = masks[regime]
        for name in CORRELATED:
            if name in ALPHA_MEASURES:
                curve = np.array([stats.spearman(m[name][mask], grades[mask]) for m in per_alpha])
                index = _pick_alpha(curve, grid, default_alpha)
                if index is None:
                    values, alpha, plateau = fixed[name], default_alpha, None
                else:
                    values, alpha = per_alpha[index][name], float(grid[index])
                    near = grid[curve >= float(np.nanmax(curve)) - PLATEAU_TOLERANCE]
                    plateau = (float(near.min()), float(near.max()))
                row = _correlate(
                    name,
                    regime,
                    values[mask],
                    grades[mask],
                    alpha,
                    plateau,
                    [float(c) for c in curve],
                )
            else:
                values = fixed[name]
                row = _correlate(name, regime, values[mask], grades[mask])
            chosen[(name, regime)] = values
            rows.append(row)
    distribution = regime_distribution(traffic)
    recommendation = recommend(rows, distribution, chosen, masks, grades, reps, seed)
    return CorrelationReport(
        judged_events=traffic.size,
        graded_events=int(np.count_nonzero(~np.isnan(grades))),
        alpha_grid=[float(a) for a in grid],
        default_alpha=default_alpha,
        rows=rows,
        regimes=distribution,
        recommendation=recommendation,
    )


# The paper's conclusions 1 and 2: T wins at K/N_p comparable to 1 or below, nDCG once K/N_p is
# high (many negatives in the top K, so their order matters).
HIGH_RATIO = 2.0


def paper_expects(distribution: RegimeDistribution) -> str:
    median = distribution.median_ratio
    return WIDE_LEAD if not math.isnan(median) and median >= HIGH_RATIO else NARROW_LEAD


def _margin(
    lead: FloatArray, other: FloatArray, grades: FloatArray, reps: int, seed: int
) -> Estimate:
    """Spearman(lead) - Spearman(other) with a paired bootstrap interval (same resamples)."""
    valid = ~(np.isnan(lead) | np.isnan(other) | np.isnan(grades))
    a, b, y = lead[valid], other[valid], grades[valid]
    value = stats.spearman(a, y) - stats.spearman(b, y)
    replicates = stats.bootstrap_spearman([a, b], y, reps, seed)
    differences = replicates[:, 0] - replicates[:, 1]
    finite = differences[np.isfinite(differences)]
    se = float(finite.std(ddof=1)) if finite.size > 1 else stats.NAN
    low, high = stats.percentile_interval(differences)
    return Estimate(value, se, low, high, int(y.size), "bootstrap")


def recommend(
    rows: list[MeasureCorrelation],
    distribution: RegimeDistribution,
    values: dict[tuple[str, str], FloatArray],
    masks: dict[str, NDArray[np.bool_]],
    grades: FloatArray,
    reps: int = 1000,
    seed: int = 0,
) -> Recommendation:
    """Lead with the reference-free measure that tracks answer quality best in the regime most
    events are in; with too few graded events there, fall back to all events, then to the paper."""
    regime = distribution.dominant
    expected = paper_expects(distribution)
    for scope in (regime, "all"):
        candidates = sorted(
            (r for r in rows if r.regime == scope and r.measure in REFERENCE_FREE and r.enough),
            key=lambda r: r.spearman,
            reverse=True,
        )
        if not candidates:
            continue
        # Measures that rank these events identically (e.g. T, T_u and precision when every
        # event has the same K) tie exactly; the paper's choice wins a tie, and the margin is
        # measured against the best measure that really differs.
        best = candidates[0].spearman
        tied = [r for r in candidates if r.spearman >= best - TIE]
        lead = next((r for r in tied if r.measure == expected), tied[0])
        others = [r for r in candidates if r.spearman < best - TIE]
        runner = others[0] if others else None
        margin = None
        if runner is not None:
            mask = masks[scope]
            margin = _margin(
                values[(lead.measure, scope)][mask],
                values[(runner.measure, scope)][mask],
                grades[mask],
                reps,
                seed,
            )
        ties = [r.measure for r in tied if r is not lead]
        text = _recommendation_text(regime, scope, lead, ties, runner, margin, expected)
        return Recommendation(
            regime=regime,
            measure=lead.measure,
            alpha=lead.alpha,
            basis="data",
            paper_expects=expected,
            tied_with=ties,
            runner_up=runner.measure if runner else None,
            margin=margin,
            text=text,
        )
    graded = max((r.n for r in rows if r.regime == "all"), default=0)
    return Recommendation(
        regime=regime,
        measure=expected,
        alpha=None,
        basis="paper",
        paper_expects=expected,
        tied_with=[],
        runner_up=None,
        margin=None,
        text=(
            f"only {graded} events carry a response grade (at least {MIN_EVENTS} needed); "
            f"at the median K/N_p of this traffic ({distribution.median_ratio:.2g}) the paper "
            f"finds {expected} tracks answer quality best"
        ),
    )


def _recommendation_text(
    regime: str,
    scope: str,
    lead: MeasureCorrelation,
    ties: list[str],
    runner: MeasureCorrelation | None,
    margin: Estimate | None,
    expected: str,
) -> str:
    where = f"{regime} traffic" if scope == regime else "all traffic (too few graded in regime)"
    alpha = ""
    if lead.alpha is not None and lead.alpha_plateau != (0.0, 1.0):
        alpha = f" at alpha {lead.alpha:g}"
    text = f"lead with {lead.measure}{alpha}: Spearman {lead.spearman:.2f} on {where}"
    if ties:
        text += f" (tied with {', '.join(ties)}: they rank these events identically)"
    if runner is not None and margin is not None:
        separated = margin.low > 0
        text += (
            f"; ahead of {runner.measure} by {margin.value:.2f} "
            f"[{margin.low:.2f}, {margin.high:.2f}]"
            + ("" if separated else ", not separable at this sample size")
        )
    agreement = "agrees with" if lead.measure == expected else "differs from"
    return f"{text}; {agreement} the paper ({expected} at this K/N_p)"
