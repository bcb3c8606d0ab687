"""The measure catalogue is the one declaration of the measures: the ``scores`` table has exactly
its columns, and every list the exports, rules, dashboards, pages and analysis use follows it.

Tests ``service.measures.catalogue``.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError
from sqlalchemy import Float, create_engine, inspect

from deploy import dashboards, rules
from deploy.config import load
from service.analysis import compare, correlation
from service.analysis.correlation import JudgedTraffic
from service.measures import catalogue
from service.measures.catalogue import BY_NAME, EXTRA_KEYS, MEASURE_NAMES, MEASURES
from service.measures.formulas import EventLabels, compute_batch, compute_measures
from service.store.models import Score
from service.telemetry.judged_export import ExportLabels, score_delta
from service.telemetry.metrics import FAMILIES, MEASURE_BUCKETS
from service.ui import render

# Columns of a score that are not measures: which event, which judge, when.
SCORE_BOOKKEEPING = {"id", "event_pk", "judge", "prompt_version", "created_at"}


def measure_columns_of_the_model() -> set[str]:
    return set(Score.__table__.columns.keys()) - SCORE_BOOKKEEPING - set(EXTRA_KEYS)  # type: ignore[attr-defined]


# --- the catalogue itself -----------------------------------------------------------------------


def test_each_measure_is_declared_once_with_a_consistent_declaration() -> None:
    assert len(set(MEASURE_NAMES)) == len(MEASURES)
    assert set(BY_NAME) == set(MEASURE_NAMES)
    ranks = [m.correlation_rank for m in MEASURES if m.correlation_rank is not None]
    assert sorted(ranks) == list(range(len(ranks))), "correlation ranks are 0, 1, 2... once each"
    for m in MEASURES:
        assert m.name.isidentifier(), m.name
        assert m.title
        assert m.short_title
        assert list(m.buckets) == sorted(set(m.buckets)), f"{m.name}: buckets rise strictly"
        # A measure that can go negative has buckets for it, and only such a measure has.
        assert m.signed == (m.buckets[0] < 0), m.name
        low, high = m.value_range
        if low is not None:
            assert m.buckets[0] >= low, f"{m.name}: no bucket below its range"
        if high is not None:
            assert m.buckets[-1] <= high, f"{m.name}: no bucket above its range"


def test_the_scores_table_has_a_column_for_each_measure_and_no_other_measure() -> None:
    assert measure_columns_of_the_model() == set(MEASURE_NAMES)
    for name in MEASURE_NAMES:
        column = Score.__table__.columns[name]  # type: ignore[attr-defined]
        assert isinstance(column.type, Float), name
        assert column.nullable, f"{name}: a measure that cannot be computed is stored as NULL"


def test_the_migrated_scores_table_has_the_catalogues_columns(store_url: str) -> None:
    engine = create_engine(store_url)
    try:
        columns = {c["name"] for c in inspect(engine).get_columns("scores")}
    finally:
        engine.dispose()
    assert columns - SCORE_BOOKKEEPING - set(EXTRA_KEYS) == set(MEASURE_NAMES)


# --- the formulas -------------------------------------------------------------------------------


def test_the_formulas_compute_each_measure_of_the_catalogue() -> None:
    labels = EventLabels(
        grades=[3, 0, 2, 1], k=2, context_rating=1, gold_relevant=[True, False], n_gold=2
    )
    one = compute_measures(labels, 0.5)
    assert list(one) == [*MEASURE_NAMES, *EXTRA_KEYS]
    assert all(one[name] is not None for name in MEASURE_NAMES)
    batch = compute_batch(
        np.array([[3, 0, 2, 1]], dtype=np.float64),
        [2],
        0.5,
        context_ratings=[1],
        gold_relevant=[[True, False]],
        n_gold=[2],
    )
    assert set(batch) == {*MEASURE_NAMES, *EXTRA_KEYS}
    for name in MEASURE_NAMES:
        assert math.isclose(float(batch[name][0]), float(one[name] or 0.0)), name


def test_only_the_measures_declared_as_using_alpha_move_with_it() -> None:
    # N_p (3 gold) and N^_p (3 relevant in the top 4) differ from K, so F and F_e depend on alpha.
    labels = EventLabels(
        grades=[3, 0, 2, 2], k=2, context_rating=1, gold_relevant=[True, False], n_gold=3
    )
    low, high = compute_measures(labels, 0.1), compute_measures(labels, 0.9)
    moved = {name for name in MEASURE_NAMES if low[name] != high[name]}
    assert moved == set(catalogue.ALPHA_MEASURES)


def test_missing_labels_void_exactly_the_measures_read_from_them() -> None:
    def with_gold(grades: list[int | None]) -> EventLabels:
        return EventLabels(
            grades=grades, k=2, context_rating=2, gold_relevant=[True, False], n_gold=1
        )

    missing_in_top = compute_measures(with_gold([3, None, 2, 2]), 0.5)
    assert {n for n in MEASURE_NAMES if missing_in_top[n] is None} == {
        m.name for m in MEASURES if m.from_judge_labels
    }
    missing_in_window = compute_measures(with_gold([3, 0, None, 2]), 0.5)
    assert {n for n in MEASURE_NAMES if missing_in_window[n] is None} == set(
        catalogue.WINDOW_MEASURES
    )
    without_gold = compute_measures(EventLabels(grades=[3, 0, 2, 2], k=2), 0.5)
    assert {n for n in MEASURE_NAMES if without_gold[n] is None} == {
        *catalogue.GOLD_MEASURES,
        "context_relevance",
    }


# --- exports ------------------------------------------------------------------------------------


def test_each_measure_is_exported_as_a_histogram_with_its_buckets() -> None:
    measure_families = [name for name in FAMILIES if name.startswith("measure_")]
    assert measure_families == [f"measure_{name}" for name in MEASURE_NAMES]
    for m in MEASURES:
        family = FAMILIES[f"measure_{m.name}"]
        assert family.kind == "histogram"
        assert family.buckets == m.buckets
    assert {m.name: m.buckets for m in MEASURES} == MEASURE_BUCKETS


def exported_families(score: dict[str, Any]) -> dict[str, float]:
    who = ExportLabels("default", "shop", "bm25", "prod", "judge", "v1", judged_passages=4)
    observed: dict[str, float] = {}
    for key, value in score_delta(who, score, None).values.items():
        family, _labels, part = json.loads(key)
        if part in ("", "count"):
            observed[family] = observed.get(family, 0.0) + value
    return observed


def test_a_score_exports_each_measure_it_has() -> None:
    full = exported_families(dict.fromkeys(MEASURE_NAMES, 0.5))
    assert {f for f in full if f.startswith("measure_")} == {f"measure_{n}" for n in MEASURE_NAMES}
    assert "events_missing_measures" not in full
    # Without the judge's labels only what does not come from them is there: the event counts
    # as one whose measures are missing.
    not_from_labels = {m.name: 0.5 for m in MEASURES if not m.from_judge_labels}
    partial = exported_families({**dict.fromkeys(MEASURE_NAMES), **not_from_labels})
    assert {f for f in partial if f.startswith("measure_")} == {
        f"measure_{n}" for n in not_from_labels
    }
    assert partial["events_missing_measures"] == 1


# --- rules and dashboards -----------------------------------------------------------------------


def test_the_rules_record_a_mean_of_each_measure() -> None:
    recorded = {
        rule["record"]: rule["expr"]
        for group in rules.render(load())["groups"]
        for rule in group["rules"]
        if "record" in rule
    }
    for m in MEASURES:
        for role in rules.ROLES:
            mean = recorded[rules.measure_mean(m.name, role)]
            # A signed measure's histogram _sum can fall, so its mean takes delta(), not rate().
            assert ("delta(" in mean) == m.signed, m.name
            assert ("rate(" in mean) != m.signed, m.name


def test_the_collapse_alert_takes_only_a_known_measure_that_cannot_go_negative() -> None:
    for m in MEASURES:
        overrides = {"alerts": {"quality_collapse": {"measure": m.name}}}
        if m.signed:
            with pytest.raises(ValidationError, match="can be negative"):
                load(overrides=overrides)
        else:
            assert load(overrides=overrides).alerts.quality_collapse.measure == m.name
    with pytest.raises(ValidationError, match="unknown measure"):
        load(overrides={"alerts": {"quality_collapse": {"measure": "no_such_measure"}}})


def test_the_overview_dashboard_has_a_panel_per_measure_with_its_title_and_axis() -> None:
    board = dashboards.overview(load())
    panels = board["panels"]
    start = next(i for i, p in enumerate(panels) if p["title"] == "All measures (mean per event)")
    per_measure = panels[start + 1 : start + 1 + len(MEASURES)]
    assert [p["title"] for p in per_measure] == [m.title for m in MEASURES]
    for m, panel in zip(MEASURES, per_measure, strict=True):
        defaults = panel["fieldConfig"]["defaults"]
        axis = (defaults.get("min"), defaults.get("max"))
        assert axis == ((0, 1) if m.unit_interval else (None, None)), m.name
        assert rules.measure_mean(m.name, "short") in panel["targets"][0]["expr"]


# --- pages --------------------------------------------------------------------------------------


def test_the_pages_name_each_measure_by_its_short_title() -> None:
    assert render.ENVIRONMENT.globals["MEASURE_TITLES"] == {m.name: m.short_title for m in MEASURES}
    assert set(catalogue.LISTED) <= set(MEASURE_NAMES)
    assert {m.name for m in MEASURES if m.unit_interval} == catalogue.UNIT_INTERVAL_MEASURES


# --- analysis -----------------------------------------------------------------------------------


def judged_traffic(n: int, seed: int) -> JudgedTraffic:
    """Random judged events with response grades and gold ids, k=3 of 6 passages sent."""
    rng = np.random.default_rng(seed)
    gold = rng.random((n, 6)) < 0.3
    return JudgedTraffic(
        grades=rng.integers(0, 4, size=(n, 6)).astype(np.float64),
        ks=np.full(n, 3),
        n_sent=np.full(n, 6),
        context_ratings=rng.integers(0, 3, size=n).astype(np.float64),
        response_grades=rng.integers(1, 6, size=n).astype(np.float64),
        gold_relevant=gold,
        # One gold passage the retriever did not send, so every event has recall.
        n_gold=gold.sum(axis=1) + 1.0,
    )


def test_the_analysis_correlates_and_compares_the_measures_the_catalogue_says() -> None:
    ranked = sorted(
        (m for m in MEASURES if m.correlation_rank is not None),
        key=lambda m: m.correlation_rank or 0,
    )
    report = correlation.correlate(judged_traffic(60, 1), alpha_grid=(0.2, 0.5, 0.8), reps=20)
    for regime in correlation.REGIMES:
        rows = [row for row in report.rows if row.regime == regime]
        assert [row.measure for row in rows] == [m.name for m in ranked]
        for row in rows:
            assert (row.spearman_by_alpha is not None) == BY_NAME[row.measure].uses_alpha
    assert tuple(m.name for m in ranked if not m.needs_gold) == correlation.REFERENCE_FREE

    compared = compare.compare_judged(judged_traffic(40, 2), judged_traffic(40, 3), 0.5, reps=20)
    assert [q.name for q in compared] == [
        *(m.name for m in MEASURES if m.compared),
        "response_grade",
    ]


def test_the_regime_leads_are_measures_every_event_has() -> None:
    for lead in (catalogue.NARROW_LEAD, catalogue.WIDE_LEAD):
        assert not BY_NAME[lead].needs_gold
