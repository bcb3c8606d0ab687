"""Hand-computed cases for every measure, and the batch form against the one-event form."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.measures import catalogue, formulas
from service.measures.catalogue import (
    GOLD_MEASURES,
    MEASURE_NAMES,
    TOP_K_MEASURES,
    WINDOW_MEASURES,
)
from service.measures.formulas import (
    EventLabels,
    compute_batch,
    compute_measures,
    dcg,
    f_measure,
    hit_at,
    k_over_np,
    ndcg_at,
    ndcg_cut,
    np_estimate,
    precision_at,
    recall_at,
    reciprocal_rank,
    t_measure,
    t_u_measure,
)

LOG2_3 = math.log2(3)
LOG2_5 = math.log2(5)


def measures(
    grades: list[int | None], k: int, alpha: float = 0.5, **extra: Any
) -> dict[str, float | None]:
    return compute_measures(EventLabels(grades=grades, k=k, **extra), alpha)


# --- building blocks ---------------------------------------------------------------------------


def test_dcg_discounts_by_log2_of_rank_plus_one() -> None:
    assert dcg([3, 2, 1], 3) == pytest.approx(3 / 1 + 2 / LOG2_3 + 1 / 2)
    assert dcg([3, 2, 1], 2) == pytest.approx(3 + 2 / LOG2_3)
    assert dcg([2], 5) == 2.0


def test_ndcg_cut_builds_the_ideal_from_all_relevant_passages() -> None:
    # Ranked: a relevant passage at rank 2 only; the query has three relevant passages.
    expected = (1 / LOG2_3) / (1 + 1 / LOG2_3)
    assert ndcg_cut([0, 1, 0], [1, 1, 1], 2) == pytest.approx(expected)
    assert ndcg_cut([0, 1, 0], [1, 1, 1], 3) == pytest.approx((1 / LOG2_3) / (1 + 1 / LOG2_3 + 0.5))
    assert ndcg_cut([0, 0], [], 2) == 0.0
    assert ndcg_cut([1, 0], [0, 1], 2) == 1.0


def test_ndcg_at_uses_only_the_top_k_gains_for_the_ideal() -> None:
    # Gains [1, 3]: ideal [3, 1]; a grade 3 outside the cutoff does not enter the ideal.
    assert ndcg_at([1, 3, 3], 2) == pytest.approx((1 + 3 / LOG2_3) / (3 + 1 / LOG2_3))
    assert ndcg_at([0, 0, 3], 2) == 0.0
    assert ndcg_at([2, 1, 0], 3) == 1.0


def test_gains_must_be_non_negative() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        dcg([1, -1], 2)


def test_precision_fills_a_short_list_with_non_relevant() -> None:
    assert precision_at([1, 0, 1], 3) == pytest.approx(2 / 3)
    assert precision_at([1, 0, 1], 10) == pytest.approx(0.2)


def test_hit_and_reciprocal_rank_only_look_within_k() -> None:
    assert hit_at([0, 0, 1], 2) == 0.0
    assert hit_at([0, 0, 1], 3) == 1.0
    assert reciprocal_rank([0, 0, 1], 2) == 0.0
    assert reciprocal_rank([0, 0, 1, 1], 4) == pytest.approx(1 / 3)
    assert reciprocal_rank([1, 1], 2) == 1.0


def test_recall_is_undefined_without_relevant_passages() -> None:
    assert recall_at([1, 0, 1, 1], 3, 4) == pytest.approx(0.5)
    assert recall_at([0, 0], 2, 0) is None
    with pytest.raises(ValueError, match="relevant in total"):
        recall_at([1, 1], 2, 1)


def test_t_and_t_u_follow_the_paper() -> None:
    # K=5, n_p=2, n_n=3, a=0.3: T = 0.7*2 - 0.3*3/5 = 1.22; T_u = 1.4 - 0.9 = 0.5.
    assert t_measure(2, 5, 0.3) == pytest.approx(1.22)
    assert t_u_measure(2, 5, 0.3) == pytest.approx(0.5)
    assert t_measure(5, 5, 1.0) == 0.0
    assert t_u_measure(0, 5, 1.0) == -5.0
    with pytest.raises(ValueError, match="n_p"):
        t_measure(6, 5, 0.5)


def test_f_measure_denominator_rule() -> None:
    # n_p=2, K=4, N_p=6, a=0.25: 2 / (1 + 4.5)
    assert f_measure(2, 4, 6, 0.25) == pytest.approx(2 / 5.5)
    assert f_measure(0, 4, 0, 0.0) == 0.0
    assert f_measure(0, 4, 0, 0.5) == 0.0


def test_np_estimate_and_regime() -> None:
    assert np_estimate([1, 0, 0, 1, 1, 1], 2) == (2, 4)
    assert np_estimate([1, 0, 1], 2) == (2, 3)
    assert k_over_np(4, 2) == 2.0
    assert k_over_np(4, 0) is None


@pytest.mark.parametrize("alpha", [-0.01, 1.01])
def test_alpha_outside_unit_interval_is_rejected(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        t_measure(1, 2, alpha)
    with pytest.raises(ValueError, match="alpha"):
        compute_measures(EventLabels(grades=[1, 2], k=2), alpha)


# --- one event -----------------------------------------------------------------------------------


def test_event_with_every_measure() -> None:
    result = measures(
        [3, 0, 2, 1, 2, 0, 0, 3],
        k=4,
        alpha=0.5,
        context_rating=1,
        gold_relevant=[False, True, False, True, True],
        n_gold=5,
    )
    assert set(result) == {*MEASURE_NAMES, "alpha", "np_window"}
    # Top 4 grades 3,0,2,1 -> relevant (>=2) at ranks 1 and 3: n_p = 2, n_n = 2.
    assert result["precision"] == 0.5
    assert result["hit"] == 1.0
    assert result["rr"] == 1.0
    ideal = 3 + 2 / LOG2_3 + 1 / 2
    assert result["ndcg"] == pytest.approx((3 + 2 / 2 + 1 / LOG2_5) / ideal)
    assert result["t"] == pytest.approx(0.5 * 2 - 0.5 * 2 / 4)
    assert result["t_u"] == pytest.approx(0.5 * 2 - 0.5 * 2)
    # Window = top 8: relevant at ranks 1, 3, 5, 8 -> N^_p = 4.
    assert result["np_window"] == 8
    assert result["f_e"] == pytest.approx(2 / (0.5 * 4 + 0.5 * 4))
    assert result["k_over_np_est"] == 1.0
    assert result["context_relevance"] == 0.5
    # Gold at ranks 2 and 4 of the top 4 (rank 5 is outside K), N_p = 5.
    assert result["recall"] == pytest.approx(2 / 5)
    assert result["f"] == pytest.approx(2 / (0.5 * 4 + 0.5 * 5))
    gold_ideal = 1 + 1 / LOG2_3 + 1 / 2 + 1 / LOG2_5
    assert result["ndcg_gold"] == pytest.approx((1 / LOG2_3 + 1 / LOG2_5) / gold_ideal)
    assert result["alpha"] == 0.5


def test_no_relevant_passage_in_top_k() -> None:
    result = measures([1, 0, 1], k=3, alpha=0.4)
    assert result["precision"] == 0.0
    assert result["hit"] == 0.0
    assert result["rr"] == 0.0
    # Graded gains still count grade 1: DCG = 1 + 1/2, ideal [1, 1, 0] = 1 + 1/log2(3).
    assert result["ndcg"] == pytest.approx(1.5 / (1 + 1 / LOG2_3))
    assert result["t"] == pytest.approx(-0.4)
    assert result["t_u"] == pytest.approx(-0.4 * 3)
    assert result["f_e"] == 0.0
    assert result["k_over_np_est"] is None  # N^_p = 0: infinite regime
    assert result["context_relevance"] is None
    assert all(result[name] is None for name in GOLD_MEASURES)


def test_all_zero_grades_give_ndcg_zero() -> None:
    assert measures([0, 0], k=2)["ndcg"] == 0.0


def test_k_equal_to_the_number_sent_estimates_from_the_top_k_only() -> None:
    result = measures([2, 0, 3], k=3, alpha=0.5)
    assert result["np_window"] == 3
    # N^_p = n_p = 2: F_e = 2 / (1.5 + 1)
    assert result["f_e"] == pytest.approx(2 / 2.5)
    assert result["k_over_np_est"] == pytest.approx(1.5)


def test_fewer_than_2k_sent_uses_all_of_them() -> None:
    result = measures([2, 0, 1, 3, 2], k=3, alpha=0.5)
    assert result["np_window"] == 5
    # n_p = 1 (rank 1); window relevant at ranks 1, 4, 5: N^_p = 3.
    assert result["f_e"] == pytest.approx(1 / (1.5 + 1.5))
    assert result["k_over_np_est"] == 1.0


def test_passages_beyond_2k_are_not_counted() -> None:
    result = measures([2, 0, 3, 3, 3, None], k=2, alpha=0.5)
    assert result["np_window"] == 4
    assert result["f_e"] == pytest.approx(1 / (1 + 1.5))
    assert result["k_over_np_est"] == pytest.approx(2 / 3)


def test_alpha_zero() -> None:
    result = measures([2, 0, 3, 1], k=2, alpha=0.0, gold_relevant=[True, False], n_gold=4)
    assert result["t"] == 1.0  # T(0) = n_p
    assert result["t_u"] == 1.0
    assert result["f_e"] == pytest.approx(1 / 2)  # n_p / N^_p
    assert result["f"] == pytest.approx(1 / 4)  # recall


def test_alpha_one() -> None:
    result = measures([2, 0, 3, 1], k=2, alpha=1.0, gold_relevant=[True, False], n_gold=4)
    assert result["t"] == pytest.approx(-0.5)  # -n_n / K = precision - 1
    assert result["t_u"] == -1.0  # -n_n
    assert result["f_e"] == pytest.approx(0.5)  # precision
    assert result["f"] == pytest.approx(0.5)


def test_missing_label_in_top_k_voids_every_judge_measure() -> None:
    result = measures([3, None, 2, 2], k=2, context_rating=2, gold_relevant=[True, False], n_gold=1)
    for name in (*TOP_K_MEASURES, *WINDOW_MEASURES):
        assert result[name] is None, name
    assert result["context_relevance"] == 1.0
    assert result["recall"] == 1.0
    assert result["np_window"] == 4


def test_missing_label_only_in_window_voids_f_e_and_regime() -> None:
    result = measures([3, 0, None, 2], k=2, alpha=0.5)
    assert result["f_e"] is None
    assert result["k_over_np_est"] is None
    assert result["precision"] == 0.5
    assert result["t"] == pytest.approx(0.5 - 0.5 * 1 / 2)
    assert result["ndcg"] == 1.0


def test_k_beyond_the_labels_means_missing_top_k_labels() -> None:
    result = measures([3, 2], k=3)
    assert all(result[name] is None for name in (*TOP_K_MEASURES, *WINDOW_MEASURES))
    assert result["np_window"] == 2


def test_no_gold_passage_for_the_query() -> None:
    result = measures([2, 0], k=2, alpha=0.5, gold_relevant=[False, False], n_gold=0)
    assert result["recall"] is None
    assert result["f"] == 0.0
    assert result["ndcg_gold"] == 0.0
    assert measures([2, 0], k=2, alpha=0.0, gold_relevant=[False], n_gold=0)["f"] == 0.0


def test_gold_without_n_gold_gives_no_gold_measure() -> None:
    result = measures([2, 0], k=2, gold_relevant=[True, False])
    assert all(result[name] is None for name in GOLD_MEASURES)


@pytest.mark.parametrize("rating", [0, 1, 2])
def test_context_relevance_scales_the_rating(rating: int) -> None:
    assert measures([0], k=1, context_rating=rating)["context_relevance"] == rating / 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grades": [1], "k": 0}, "at least 1"),
        ({"grades": [4], "k": 1}, "grades"),
        ({"grades": [1], "k": 1, "context_rating": 3}, "context rating"),
        ({"grades": [1], "k": 1, "threshold": 4}, "threshold"),
        ({"grades": [1], "k": 1, "gold_relevant": [True, True], "n_gold": 1}, "n_gold"),
        ({"grades": [1], "k": 1, "gold_relevant": [], "n_gold": -1}, "n_gold"),
    ],
)
def test_invalid_labels_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EventLabels(**kwargs)


def test_threshold_decides_relevance() -> None:
    assert measures([1, 1, 3], k=3, threshold=1)["precision"] == 1.0
    assert measures([1, 1, 3], k=3, threshold=3)["precision"] == pytest.approx(1 / 3)


# --- batch form ----------------------------------------------------------------------------------


def test_batch_hand_case() -> None:
    nan = np.nan
    out = compute_batch(
        np.array([[3, 0, 2, 1, 2, 0, 0, 3], [3, nan, 2, 2, nan, nan, nan, nan]]),
        np.array([4, 2]),
        0.5,
        n_sent=np.array([8, 4]),
        context_ratings=np.array([1, nan]),
        gold_relevant=np.array([[0, 1, 0, 1, 1], [1, 0, 0, 0, 0]], dtype=bool),
        n_gold=np.array([5, nan]),
    )
    assert out["precision"][0] == 0.5
    assert out["f_e"][0] == pytest.approx(0.5)
    assert out["recall"][0] == pytest.approx(0.4)
    assert out["np_window"].tolist() == [8.0, 4.0]
    for name in (*TOP_K_MEASURES, *WINDOW_MEASURES, *GOLD_MEASURES, "context_relevance"):
        assert np.isnan(out[name][1]), name


@st.composite
def events(draw: st.DrawFn) -> EventLabels:
    k = draw(st.integers(1, 6))
    n_sent = draw(st.integers(0, 2 * k + 2))
    grade = st.one_of(st.none(), st.integers(0, 3)) if draw(st.booleans()) else st.integers(0, 3)
    grades = draw(st.lists(grade, min_size=n_sent, max_size=n_sent))
    gold: list[bool] | None = None
    n_gold: int | None = None
    if draw(st.booleans()):
        gold = draw(st.lists(st.booleans(), min_size=n_sent, max_size=n_sent))
        n_gold = sum(gold) + draw(st.integers(0, 4))
    return EventLabels(
        grades=grades,
        k=k,
        context_rating=draw(st.one_of(st.none(), st.integers(0, 2))),
        gold_relevant=gold,
        n_gold=n_gold,
    )


def _as_batch(
    items: list[EventLabels], alpha: float, threshold: int
) -> dict[str, npt.NDArray[np.float64]]:
    width = max([len(e.grades) for e in items] + [1])
    grades = np.full((len(items), width), np.nan)
    gold = np.zeros((len(items), width), dtype=bool)
    n_gold = np.full(len(items), np.nan)
    for row, event in enumerate(items):
        grades[row, : len(event.grades)] = [np.nan if g is None else g for g in event.grades]
        if event.gold_relevant is not None and event.n_gold is not None:
            gold[row, : len(event.gold_relevant)] = event.gold_relevant
            n_gold[row] = event.n_gold
    return compute_batch(
        grades,
        np.array([e.k for e in items]),
        alpha,
        n_sent=np.array([len(e.grades) for e in items]),
        threshold=threshold,
        context_ratings=np.array(
            [np.nan if e.context_rating is None else e.context_rating for e in items]
        ),
        gold_relevant=gold,
        n_gold=n_gold,
    )


@settings(max_examples=300, deadline=None)
@given(
    items=st.lists(events(), min_size=1, max_size=8),
    alpha=st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1)),
    threshold=st.integers(1, 3),
)
def test_batch_equals_one_event_form(
    items: list[EventLabels], alpha: float, threshold: int
) -> None:
    items = [dataclasses.replace(event, threshold=threshold) for event in items]
    batch = _as_batch(items, alpha, threshold)
    for row, event in enumerate(items):
        single = compute_measures(event, alpha)
        assert set(batch) == set(single)
        for name, value in single.items():
            got = batch[name][row]
            if value is None:
                assert np.isnan(got), (name, event)
            else:
                assert got == pytest.approx(value, rel=1e-12, abs=1e-12), (name, event)


def test_batch_of_no_events() -> None:
    out = compute_batch(np.zeros((0, 0)), np.zeros(0, dtype=int), 0.5)
    assert set(out) == {*MEASURE_NAMES, "alpha", "np_window"}
    assert all(values.shape == (0,) for values in out.values())


def imports_of(module: ModuleType) -> set[str]:
    """The dotted modules ``module`` imports."""
    imported: set[str] = set()
    for node in ast.walk(ast.parse(Path(str(module.__file__)).read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            imported.add(node.module or "")
    return imported


# The catalogue is plain data; the formulas read only the catalogue's names from the project.
@pytest.mark.parametrize(
    ("module", "project_imports"),
    [(catalogue, set()), (formulas, {"service.measures.catalogue"})],
)
def test_measures_modules_import_nothing_else_from_the_project(
    module: ModuleType, project_imports: set[str]
) -> None:
    imported = imports_of(module)
    assert {m for m in imported if m.split(".")[0] == "service"} == project_imports
    outside = {m.split(".")[0] for m in imported if m.split(".")[0] != "service"}
    assert outside <= {"__future__", "collections", "dataclasses", "math", "numpy", "typing"}
