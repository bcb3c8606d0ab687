"""Two windows, or two retriever versions, side by side: is the difference real at this size?

Proportions (the ceiling, hit@c, conversion, accuracy) get a two-proportion z test with
Newcombe's interval; means (MRR, mean recall, judge measures, response grades) a bootstrap
difference test. Each says the smallest difference its sample sizes could have detected, so a
"not distinguishable" reads as what it is: the article's 50 questions cannot show 3 points.
When both sides answered the same gold questions (a retriever replayed on one gold set), the
ceiling is also tested paired (McNemar), which needs far fewer questions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from service.analysis import stats
from service.analysis.correlation import JudgedTraffic
from service.analysis.gold import GoldEvent, ceiling_and_conversion, predicted_accuracy
from service.analysis.stats import DifferenceTest, Estimate
from service.measures.catalogue import COMPARED

MIN_PAIRS = 10


@dataclass(frozen=True)
class SideData:
    label: str
    traffic: JudgedTraffic
    gold: list[GoldEvent]


@dataclass(frozen=True)
class SideSummary:
    label: str
    judged_events: int
    gold_events: int


@dataclass(frozen=True)
class ComparedQuantity:
    name: str
    test: DifferenceTest


@dataclass(frozen=True)
class ComparisonReport:
    """B against A (A is the baseline: the earlier window, or the first retriever named).

    ``predicted_b``: B's ceiling times A's conversion, the article's forecast of a retriever
    change, next to ``observed_b``; a gap means something besides retrieval moved.
    """

    a: SideSummary
    b: SideSummary
    alpha: float
    quantities: list[ComparedQuantity]
    paired_ceiling: ComparedQuantity | None
    predicted_b: Estimate
    observed_b: Estimate
    notes: list[str] = field(default_factory=list)


def _hits(events: Sequence[GoldEvent], cutoff: int) -> tuple[int, int]:
    deep = [e for e in events if e.depth >= cutoff]
    return sum(1 for e in deep if e.found_within(cutoff) > 0), len(deep)


def _proportion_test(name: str, a: Estimate, b: Estimate) -> ComparedQuantity:
    successes_a = round(a.value * a.n) if a.n else 0
    successes_b = round(b.value * b.n) if b.n else 0
    return ComparedQuantity(name, stats.two_proportion_test(successes_a, a.n, successes_b, b.n))


def compare_gold(
    a: Sequence[GoldEvent],
    b: Sequence[GoldEvent],
    cutoffs: Sequence[int],
    *,
    reps: int = stats.BOOTSTRAP_REPS,
    seed: int = 0,
) -> list[ComparedQuantity]:
    if not a or not b:
        return []
    ceiling_a, conversion_a, observed_a = ceiling_and_conversion(a)
    ceiling_b, conversion_b, observed_b = ceiling_and_conversion(b)
    out = [
        _proportion_test("ceiling", ceiling_a, ceiling_b),
        ComparedQuantity(
            "mrr",
            stats.mean_difference_test(
                [e.reciprocal_rank for e in a],
                [e.reciprocal_rank for e in b],
                reps=reps,
                seed=seed,
            ),
        ),
        ComparedQuantity(
            "recall_at_k",
            stats.mean_difference_test(
                [e.found_within(e.k) / e.n_gold for e in a],
                [e.found_within(e.k) / e.n_gold for e in b],
                reps=reps,
                seed=seed,
            ),
        ),
    ]
    for cutoff in sorted(set(cutoffs)):
        hits_a, n_a = _hits(a, cutoff)
        hits_b, n_b = _hits(b, cutoff)
        if n_a and n_b:
            out.append(
                ComparedQuantity(
                    f"hit@{cutoff}", stats.two_proportion_test(hits_a, n_a, hits_b, n_b)
                )
            )
    if conversion_a.n and conversion_b.n:
        out.append(_proportion_test("conversion", conversion_a, conversion_b))
    if observed_a.n and observed_b.n:
        out.append(_proportion_test("observed_accuracy", observed_a, observed_b))
    return out


def paired_ceiling(a: Sequence[GoldEvent], b: Sequence[GoldEvent]) -> ComparedQuantity | None:
    """McNemar on the questions both sides answered (matched by query text, first occurrence)."""
    first_a: dict[str, GoldEvent] = {}
    for event in a:
        first_a.setdefault(event.query, event)
    seen: set[str] = set()
    only_a = only_b = both = neither = 0
    for event in b:
        match = first_a.get(event.query)
        if not event.query or match is None or event.query in seen:
            continue
        seen.add(event.query)
        hit_a, hit_b = match.in_prompt, event.in_prompt
        both += hit_a and hit_b
        only_a += hit_a and not hit_b
        only_b += hit_b and not hit_a
        neither += not hit_a and not hit_b
    if len(seen) < MIN_PAIRS:
        return None
    return ComparedQuantity("ceiling (paired)", stats.mcnemar_test(only_a, only_b, both, neither))


def compare_judged(
    a: JudgedTraffic,
    b: JudgedTraffic,
    alpha: float,
    *,
    reps: int = stats.BOOTSTRAP_REPS,
    seed: int = 0,
) -> list[ComparedQuantity]:
    """Mean judge measures (at the configured alpha) and mean response grade, B - A."""
    if a.size == 0 or b.size == 0:
        return []
    measures_a, measures_b = a.measures(alpha), b.measures(alpha)
    out: list[ComparedQuantity] = []
    for name in COMPARED:
        values_a, values_b = measures_a[name], measures_b[name]
        if np.isnan(values_a).all() or np.isnan(values_b).all():
            continue
        out.append(
            ComparedQuantity(
                name, stats.mean_difference_test(values_a, values_b, reps=reps, seed=seed)
            )
        )
    if not (np.isnan(a.response_grades).all() or np.isnan(b.response_grades).all()):
        out.append(
            ComparedQuantity(
                "response_grade",
                stats.mean_difference_test(
                    a.response_grades, b.response_grades, reps=reps, seed=seed
                ),
            )
        )
    return out


def compare(
    a: SideData,
    b: SideData,
    *,
    alpha: float,
    cutoffs: Sequence[int],
    reps: int = stats.BOOTSTRAP_REPS,
    seed: int = 0,
) -> ComparisonReport:
    quantities = compare_gold(a.gold, b.gold, cutoffs, reps=reps, seed=seed)
    quantities += compare_judged(a.traffic, b.traffic, alpha, reps=reps, seed=seed)
    _, _, observed_b = ceiling_and_conversion(b.gold)
    predicted = (
        predicted_accuracy(b.gold, conversion_from=a.gold, reps=reps, seed=seed)
        if a.gold and b.gold
        else Estimate.empty("bootstrap")
    )
    report = ComparisonReport(
        a=SideSummary(a.label, a.traffic.size, len(a.gold)),
        b=SideSummary(b.label, b.traffic.size, len(b.gold)),
        alpha=alpha,
        quantities=quantities,
        paired_ceiling=paired_ceiling(a.gold, b.gold),
        predicted_b=predicted,
        observed_b=observed_b,
    )
    report.notes.extend(_notes(report))
    return report


def _notes(report: ComparisonReport) -> list[str]:
    notes: list[str] = []
    for item in report.quantities:
        test = item.test
        if test.real:
            notes.append(
                f"{item.name}: {test.difference:+.3f} [{test.low:+.3f}, {test.high:+.3f}] "
                f"is real (p={test.p_value:.3f})"
            )
        elif test.needed_per_group is not None and item.name in ("ceiling", "mrr"):
            notes.append(
                f"{item.name}: {test.difference:+.3f} is within noise at n={test.n_a}/"
                f"{test.n_b}; about {test.needed_per_group} per side would show a difference "
                "this size"
            )
    predicted, observed = report.predicted_b, report.observed_b
    if predicted.n and observed.n and not (predicted.low <= observed.value <= predicted.high):
        notes.append(
            f"observed accuracy {observed.value:.3f} is outside the {predicted.value:.3f} "
            f"[{predicted.low:.3f}, {predicted.high:.3f}] that B's ceiling and A's conversion "
            "predict: something besides retrieval moved"
        )
    return notes
