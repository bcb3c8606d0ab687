"""Checking a judge against gold labels, and fitting the local judge's similarity thresholds.

Plain numpy in, numbers out. Passages come grouped by query; a query's passages are not
independent (one hard query makes many errors at once), so every interval here resamples whole
queries (a cluster bootstrap) rather than passages, which would be too narrow.

The gold labels are binary (a passage answers the query or not) while the judge grades 0-3, so a
grade threshold g turns the judge binary (relevant = grade >= g) and each threshold is checked on
its own. The local judge's three similarity thresholds are fitted on one set of queries, each for
what its grade means: grade 1 ("related") favours recall (F2), grade 2 (the default relevance
threshold) maximises Cohen's kappa, grade 3 ("answers the query") favours precision (F0.5).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
IntArray = npt.NDArray[np.int64]

LEVEL = 0.95
NAN = float("nan")


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    def format(self, digits: int = 2) -> str:
        if math.isnan(self.value):
            return "n/a"
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


@dataclass(frozen=True)
class Agreement:
    """A binary judge against binary gold labels, with cluster-bootstrap intervals."""

    passages: int
    queries: int
    gold_positive: int
    judge_positive: int
    precision: Interval
    recall: Interval
    f1: Interval
    kappa: Interval


def per_query_counts(judge: BoolArray, gold: BoolArray, query: IntArray) -> IntArray:
    """Rows of (tp, fp, fn, tn) per query index 0..Q-1."""
    judge = np.asarray(judge, dtype=bool)
    gold = np.asarray(gold, dtype=bool)
    query = np.asarray(query, dtype=np.int64)
    if not judge.shape == gold.shape == query.shape:
        raise ValueError("judge, gold and query must have the same length")
    cells = np.stack([judge & gold, judge & ~gold, ~judge & gold, ~judge & ~gold], axis=1)
    groups = int(query.max()) + 1 if query.size else 0
    counts = np.zeros((groups, 4), dtype=np.int64)
    np.add.at(counts, query, cells.astype(np.int64))
    return counts


def scores_from_counts(counts: npt.NDArray[np.float64] | IntArray) -> FloatArray:
    """Precision, recall, F1 and Cohen's kappa from summed (tp, fp, fn, tn); rows or one row.

    NaN where undefined (no positive judgement, no gold positive, chance agreement of 1).
    """
    c = np.asarray(counts, dtype=np.float64)
    tp, fp, fn, tn = c[..., 0], c[..., 1], c[..., 2], c[..., 3]
    n = tp + fp + fn + tn
    with np.errstate(invalid="ignore", divide="ignore"):
        precision = tp / (tp + fp)
        recall = tp / (tp + fn)
        f1 = 2 * tp / (2 * tp + fp + fn)
        observed = (tp + tn) / n
        chance = ((tp + fp) * (tp + fn) + (fn + tn) * (fp + tn)) / (n * n)
        kappa = np.where(chance < 1.0, (observed - chance) / (1.0 - chance), np.nan)
    result: FloatArray = np.stack([precision, recall, f1, kappa], axis=-1)
    return result


def agreement(
    judge: BoolArray,
    gold: BoolArray,
    query: IntArray,
    *,
    reps: int = 2000,
    seed: int = 0,
    level: float = LEVEL,
) -> Agreement:
    """Precision, recall, F1 and kappa of ``judge`` against ``gold``; queries are the clusters.

    ``query`` numbers each passage's query 0..Q-1. Intervals are bootstrap percentiles over
    ``reps`` resamples of whole queries.
    """
    counts = per_query_counts(judge, gold, query)
    point = scores_from_counts(counts.sum(axis=0))
    groups = counts.shape[0]
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, groups, size=(reps, groups))
    weights = np.zeros((reps, groups), dtype=np.float64)
    np.add.at(weights, (np.repeat(np.arange(reps), groups), draws.reshape(-1)), 1.0)
    replicates = scores_from_counts(weights @ counts.astype(np.float64))
    tail = (1.0 - level) / 2.0
    intervals = []
    for column in range(4):
        finite = replicates[:, column][np.isfinite(replicates[:, column])]
        if finite.size == 0 or math.isnan(point[column]):
            intervals.append(Interval(float(point[column]), NAN, NAN))
            continue
        low, high = np.quantile(finite, [tail, 1.0 - tail])
        intervals.append(Interval(float(point[column]), float(low), float(high)))
    total = counts.sum(axis=0)
    return Agreement(
        passages=int(total.sum()),
        queries=groups,
        gold_positive=int(total[0] + total[2]),
        judge_positive=int(total[0] + total[1]),
        precision=intervals[0],
        recall=intervals[1],
        f1=intervals[2],
        kappa=intervals[3],
    )


def _sweep(scores: FloatArray, gold: BoolArray) -> tuple[FloatArray, FloatArray]:
    """Every distinct cut "relevant when score >= cut": the cuts and their (tp, fp, fn, tn)."""
    order = np.argsort(-scores, kind="stable")
    sorted_scores = scores[order]
    sorted_gold = gold[order]
    tp = np.cumsum(sorted_gold)
    fp = np.cumsum(~sorted_gold)
    # A cut can only fall between distinct values: keep the last index of each run of ties.
    last = np.r_[sorted_scores[1:] != sorted_scores[:-1], True]
    positives, negatives = int(gold.sum()), int((~gold).sum())
    tp, fp, cuts = tp[last], fp[last], sorted_scores[last]
    counts = np.stack([tp, fp, positives - tp, negatives - fp], axis=1).astype(np.float64)
    return cuts, counts


def fit_threshold(scores: FloatArray, gold: BoolArray, objective: str) -> float:
    """The cut on ``scores`` that maximises ``objective``: "kappa" or "f<beta>" (f1, f2, f0.5)."""
    scores = np.asarray(scores, dtype=np.float64)
    gold = np.asarray(gold, dtype=bool)
    if scores.size == 0 or not gold.any() or gold.all():
        raise ValueError("fitting a threshold needs both relevant and irrelevant passages")
    cuts, counts = _sweep(scores, gold)
    if objective == "kappa":
        values = scores_from_counts(counts)[:, 3]
    elif objective.startswith("f"):
        beta2 = float(objective[1:]) ** 2
        tp, fp, fn = counts[:, 0], counts[:, 1], counts[:, 2]
        values = (1 + beta2) * tp / ((1 + beta2) * tp + beta2 * fn + fp)
    else:
        raise ValueError(f"unknown objective {objective!r}")
    best = int(np.nanargmax(values))
    # Halfway to the next lower score, so the cut does not sit on a fitted passage's value.
    below = scores[scores < cuts[best]]
    return float((cuts[best] + below.max()) / 2) if below.size else float(cuts[best])


GRADE_OBJECTIVES = ("f2", "kappa", "f0.5")  # grades 1, 2, 3


def fit_thresholds(
    scores: FloatArray, gold: BoolArray, objectives: Sequence[str] = GRADE_OBJECTIVES
) -> tuple[float, float, float]:
    """Similarity thresholds for grades 1, 2 and 3, kept ascending."""
    fitted = [fit_threshold(scores, gold, objective) for objective in objectives]
    if len(fitted) != 3:
        raise ValueError("need one objective per grade 1, 2 and 3")
    t1 = min(fitted[0], fitted[1])
    t3 = max(fitted[2], fitted[1])
    return round(t1, 3), round(fitted[1], 3), round(t3, 3)


def split_queries(query_ids: Sequence[str], seed: int = 0) -> tuple[set[str], set[str]]:
    """Two halves of the queries, at random but reproducibly: (calibration, held out)."""
    ordered = sorted(query_ids)
    rng = np.random.default_rng(seed)
    shuffled = [ordered[i] for i in rng.permutation(len(ordered))]
    half = len(shuffled) // 2
    return set(shuffled[:half]), set(shuffled[half:])
