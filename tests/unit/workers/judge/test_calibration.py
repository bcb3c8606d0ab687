"""Agreement with gold labels and fitting the local judge's thresholds
(``service.analysis.threshold_fit``)."""

from __future__ import annotations

import numpy as np
import pytest

from service.analysis.stats import cohens_kappa
from service.analysis.threshold_fit import (
    agreement,
    fit_threshold,
    fit_thresholds,
    per_query_counts,
    scores_from_counts,
    split_queries,
)


def test_scores_from_a_confusion_table() -> None:
    tp, fp, fn, tn = 30, 10, 20, 140
    precision, recall, f1, kappa = scores_from_counts(np.array([tp, fp, fn, tn]))
    assert precision == pytest.approx(30 / 40)
    assert recall == pytest.approx(30 / 50)
    assert f1 == pytest.approx(2 * 0.75 * 0.6 / (0.75 + 0.6))
    assert kappa == pytest.approx(cohens_kappa([[tp, fp], [fn, tn]]).kappa)
    undefined = scores_from_counts(np.array([0, 0, 0, 10]))
    assert np.isnan(undefined).all()  # nothing judged or gold relevant: every score undefined


def test_counts_are_kept_per_query() -> None:
    judge = np.array([True, False, True, True])
    gold = np.array([True, True, False, True])
    query = np.array([0, 0, 1, 1])
    assert per_query_counts(judge, gold, query).tolist() == [[1, 0, 1, 0], [1, 1, 0, 0]]


def test_intervals_resample_queries_and_bracket_the_estimate() -> None:
    rng = np.random.default_rng(3)
    query = np.repeat(np.arange(60), 10)
    gold = rng.random(600) < 0.2
    judge = np.where(rng.random(600) < 0.8, gold, ~gold)  # right four times in five
    result = agreement(judge, gold, query, reps=500)
    assert (result.queries, result.passages) == (60, 600)
    assert result.gold_positive == int(gold.sum())
    for value in (result.precision, result.recall, result.f1, result.kappa):
        assert value.low <= value.value <= value.high
        assert value.high - value.low > 0.02
    assert 0.2 < result.kappa.value < 0.7
    perfect = agreement(gold, gold, query, reps=200)
    assert (perfect.kappa.value, perfect.kappa.low, perfect.kappa.high) == (1.0, 1.0, 1.0)


def test_a_separating_threshold_is_found_between_the_classes() -> None:
    scores = np.array([0.1, 0.2, 0.3, 0.6, 0.7, 0.8])
    gold = np.array([False, False, False, True, True, True])
    cut = fit_threshold(scores, gold, "kappa")
    assert 0.3 < cut <= 0.6
    assert fit_threshold(scores, gold, "f1") == cut


def test_recall_leaning_grades_get_lower_thresholds() -> None:
    rng = np.random.default_rng(1)
    gold = rng.random(4000) < 0.15
    scores = rng.normal(0.0, 1.0, 4000) + 1.5 * gold  # overlapping classes
    t1, t2, t3 = fit_thresholds(scores, gold)
    assert t1 < t2 < t3
    with pytest.raises(ValueError, match="both"):
        fit_threshold(scores, np.zeros(4000, dtype=bool), "kappa")
    with pytest.raises(ValueError, match="objective"):
        fit_threshold(scores, gold, "auc")


def test_the_query_split_is_disjoint_complete_and_reproducible() -> None:
    ids = [str(i) for i in range(101)]
    first, second = split_queries(ids, seed=5)
    assert first.isdisjoint(second)
    assert first | second == set(ids)
    assert len(first) == 50
    assert split_queries(list(reversed(ids)), seed=5) == (first, second)
    assert split_queries(ids, seed=6) != (first, second)
